"""The placeholder ban as a batch-level logits processor of this repository's host.

Importing it needs the host's `modules.logits_processors`; `script.py` falls back to
`logits_processor_modifier` in hosts without it (text-generation-webui). `batch_ban_class(ids)`
makes the class the host constructs after the extension's `setup()`: `ids()` then gives the
pipeline's placeholder ids, banned for every request (not argmax-invariant: the placeholder may
well be the argmax). It keeps no per-request state.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from extensions.multimodal.placeholder_ban import ban
from modules.logits_processors import BatchUpdate, HostConfig, LogitsProcessor


def batch_ban_class(ids: Callable[[], list[int]]) -> type:
    """A `LogitsProcessor` class banning `ids()`, read once when the host constructs it."""

    class PlaceholderBan(LogitsProcessor):
        def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool):
            self.ids = ids()

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
            """Every request is banned alike: nothing to follow."""

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return ban(logits, self.ids)

    return PlaceholderBan
