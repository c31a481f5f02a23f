"""The placeholder ban as a batch-level logits processor of this repository's host.

It needs the host's `modules.logits_processors`; in hosts without it (text-generation-webui)
`batch_ban_class` gives None and `script.py` falls back to `logits_processor_modifier`.
`batch_ban_class(ids)` makes the class the host constructs after the extension's `setup()`: `ids()` then gives the
pipeline's placeholder ids, banned for every request (not argmax-invariant: the placeholder may
well be the argmax). It keeps no per-request state.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from extensions.multimodal.core.placeholder_ban import ban

try:
    from modules.logits_processors import BatchUpdate, HostConfig, LogitsProcessor
except ImportError as error:  # a host without batch-level logits processors (text-generation-webui)
    if error.name != "modules.logits_processors":
        raise
    LogitsProcessor = None


def batch_ban_class(ids: Callable[[], list[int]]) -> Optional[type]:
    """A `LogitsProcessor` class banning `ids()`, read once when the host constructs it; None in a host
    without batch-level logits processors."""
    if LogitsProcessor is None:
        return None

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
