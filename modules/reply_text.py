"""A reply's text as its token ids arrive, at a cost per token that does not grow with the reply.

In: the reply's new ids, a batch at a time (`add`); out: the reply's text so far. `finish()` gives
exactly `decode(all ids)`.

Decoding the whole reply again at every token costs O(length) per token (transformers' `decode`
also walks the ids in Python), quadratic over a reply, and it runs on the thread that streams the
reply while holding the GIL that the generating thread needs for every step. As vLLM's detokenizer
does, each step decodes only the ids since the last step plus the step before them as context (a
SentencePiece tokenizer drops the leading space of a decoded window's first id, and one character may
span several byte-level ids), and appends what the new ids added. Text that ends in U+FFFD (an
incomplete character) waits for the next ids. A tokenizer whose text of a window is not a prefix of
the longer window's (clean-up rules across ids) can make the streamed text differ from the whole
decode for a step; `finish()` always decodes the whole reply once, so the final reply is exact.
This module knows nothing about models or threads.
"""
from __future__ import annotations

from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class ReplyText:
    def __init__(self, decode: Decode):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0  # ids[prefix_offset:read_offset]: the context decoded with the new ids
        self.read_offset = 0  # ids before this are in `text`

    def add(self, new_ids: Sequence[int]) -> str:
        """The reply's text after `new_ids`."""
        self.ids.extend(new_ids)
        context = self.decode(self.ids[self.prefix_offset:self.read_offset]) if self.read_offset > self.prefix_offset else ""
        window = self.decode(self.ids[self.prefix_offset:])
        if len(window) > len(context) and not window.endswith("\ufffd"):
            self.text += window[len(context):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self.text

    def finish(self) -> str:
        """The whole reply decoded at once: exact, whatever the tokenizer's rules across ids."""
        self.text = self.decode(self.ids)
        self.prefix_offset = self.read_offset = len(self.ids)
        return self.text
