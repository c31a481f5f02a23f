"""`BoundedLRU`: a dict with least-recently-used eviction once the stored values exceed `max_bytes`
(`max_bytes=0` disables it). Values are stored as given: callers must not modify them, except a value
they `take`, which leaves it. Thread-safe."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable, Optional


class BoundedLRU:
    """A dict with least-recently-used eviction, bounded by the byte sizes given to `put`."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 disables the cache), got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.total_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Optional[Any]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def take(self, key: Hashable) -> Optional[Any]:
        """The value stored under `key`, removed: the caller may modify it."""
        with self._lock:
            return self._pop(key)

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Store `value`; one larger than the whole budget is not stored at all."""
        if nbytes > self.max_bytes:
            return
        with self._lock:
            self._pop(key)
            self._entries[key] = (value, nbytes)
            self.total_bytes += nbytes
            while self.total_bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.total_bytes -= evicted

    def _pop(self, key: Hashable) -> Optional[Any]:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.total_bytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.total_bytes = 0
