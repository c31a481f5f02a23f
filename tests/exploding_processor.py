"""A test logits processor that raises in `apply()` while a request that sent `explode` is in the batch."""
from __future__ import annotations

from modules.logits_processors import LogitsProcessor


class Exploding(LogitsProcessor):
    def __init__(self, config, device, is_pin_memory):
        self.armed: set[int] = set()

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.armed.discard(index)
        for index, params, _, _ in batch_update.added:
            self.armed.discard(index)
            if (params.extra_args or {}).get("explode"):
                self.armed.add(index)

    def apply(self, logits):
        if self.armed:
            raise RuntimeError("the fuse was lit")
        return logits
