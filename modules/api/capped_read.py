"""Reading a body under a byte cap: the API's request bodies and the images it fetches.

`read_capped` refuses a body as soon as it is known to pass the cap: by its declared length before
anything is read, else by the bytes read so far, so an endless stream costs at most the cap. It
raises `TooLarge`; each caller turns that into its own error (a 413 saying what was too large) and
does what its side of the connection needs (the request's reader drains the rest).
"""
from __future__ import annotations

from typing import AsyncIterable


class TooLarge(Exception):
    """A body passed the cap: `size` bytes, declared up front (`declared`) or read so far."""

    def __init__(self, size: int, declared: bool):
        super().__init__(f"{size} bytes ({'declared' if declared else 'read'})")
        self.size = size
        self.declared = declared


async def read_capped(chunks: AsyncIterable[bytes], content_length: str | None, limit: int) -> bytes:
    """All of `chunks`, at most `limit` bytes; `content_length` is the Content-Length header as sent
    (one that is not a number is left to the bytes read)."""
    declared = content_length or ""
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(int(declared), declared=True)
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise TooLarge(size, declared=False)
        parts.append(chunk)
    return b"".join(parts)
