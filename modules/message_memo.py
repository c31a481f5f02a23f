"""`MessageMemo`: what the host works out from a history's message, kept by the message's text.

A history keeps each picture in its message's text, megabytes of base64 for a phone photo, and the
host reads every message again at every turn and every streamed update. What it works out from one
(its HTML, its text with the pictures set aside) is kept under a key that begins with the text itself:
while the chat holds that string nothing is copied, and looking it up hashes it once (a Python string
keeps its hash). Bounded by the characters of the texts it keeps, the least recently used going first;
thread-safe. Values are shared: callers must not modify them. The API keeps what it decoded from a
request's data URLs the same way, by the URL (an OpenAI-style client sends each picture again).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional


class MessageMemo:
    def __init__(self, max_chars: int):
        self.max_chars, self.chars = max_chars, 0
        self.entries: OrderedDict[tuple, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> Optional[Any]:
        """The value kept under `key` (whose first item is the message's text), or None."""
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
            return self.entries.get(key)

    def put(self, key: tuple, value: Any) -> None:
        with self.lock:
            if key not in self.entries:
                self.entries[key] = value
                self.chars += len(key[0])
            while self.chars > self.max_chars:
                evicted, _ = self.entries.popitem(last=False)
                self.chars -= len(evicted[0])
