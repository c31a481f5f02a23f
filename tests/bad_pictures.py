"""One corpus of pictures a server must refuse, for both hosts: this repository's API
(tests/test_bad_pictures.py) and today's text-generation-webui's real server
(tools/tgw_bad_pictures.py, run by tools/check_in_tgw.sh).

Each case is an OpenAI `image_url` URL that no host may read: bytes that are no picture, a picture
cut short, a decompression bomb, a URL into the server's own network or file system. A host must
answer each with HTTP 400 and a message that names the picture and says what is wrong with it
(`words`: at least one of them, case-insensitive), and go on serving.
Only the standard library and Pillow here: text-generation-webui's Python imports this too.
"""
from __future__ import annotations

import base64
import io
import struct
import zlib
from dataclasses import dataclass

from PIL import Image


@dataclass(frozen=True)
class BadPicture:
    name: str
    url: str
    words: tuple[str, ...]  # any one of them names the cause


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png(size: tuple[int, int] = (48, 32)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims `width x height` 8-bit grey pixels in a few dozen bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) +
            chunk(b"IEND", b""))


# Ways hosts say that bytes are no picture they can read.
UNREADABLE = ("not an image", "not a picture", "cannot identify", "unrecognized", "decode", "truncated", "broken",
              "cut short", "incomplete")


def cases() -> list[BadPicture]:
    whole = png()
    return [
        BadPicture("broken base64", "data:image/png;base64,iVBORw0KGgo!!!*not-base64*", ("base64",)),
        BadPicture("text posing as PNG", data_url(b"this is plain text, not a picture at all"), UNREADABLE),
        BadPicture("truncated PNG", data_url(whole[:len(whole) // 2]), UNREADABLE),
        BadPicture("20000x20000 decompression bomb", data_url(png_header_only(20000, 20000)),
                   ("pixels", "too large", "bomb")),
        BadPicture("private-address URL", "http://127.0.0.1:9/picture.png",
                   ("private", "non-public", "blocked", "local", "not allowed", "loopback", "refuse")),
        BadPicture("file:// URL", "file:///etc/passwd", ("unsupported", "scheme")),
        BadPicture("14-byte GIF", data_url(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif"), UNREADABLE),
        BadPicture("empty data URL", "data:image/png;base64,", ("no data", "no bytes", "empty", "0 bytes") + UNREADABLE),
        BadPicture("PNG header only", data_url(whole[:40]), UNREADABLE),
        BadPicture("zero bytes labelled JPEG", data_url(b"\0" * 64, "image/jpeg"), UNREADABLE),
    ]


def request_body(case: BadPicture, question: str = "What is in this picture?") -> dict:
    """A greedy chat request whose only picture is the bad one."""
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": question},
                                                      {"type": "image_url", "image_url": {"url": case.url}}]}],
            "max_tokens": 4, "temperature": 0}


def names_the_cause(message: str, case: BadPicture) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in case.words)
