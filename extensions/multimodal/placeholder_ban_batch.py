"""The placeholder ban as a batch-level logits processor of this repository's host.

Importing it needs the host's `modules.logits_processors`; `script.py` falls back to
`logits_processor_modifier` in hosts without it (text-generation-webui). Constructed after the
extension's `setup()`, so the pipeline is known: it bans that pipeline's placeholder ids for every
request (not argmax-invariant: the placeholder may well be the argmax). It keeps no per-request state.
"""
from __future__ import annotations

from typing import Optional

import torch

from extensions.multimodal.placeholder_ban import ban, placeholder_ids
from modules.logits_processors import BatchUpdate, HostConfig, LogitsProcessor


class PlaceholderBan(LogitsProcessor):
    def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool):
        # Imported here: script.py imports this module. The pipeline is fixed after start-up.
        from extensions.multimodal import script

        embedder = script.multimodal_embedder
        self.ids = placeholder_ids(embedder.pipeline) if embedder is not None else []

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        """Every request is banned alike: nothing to follow."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return ban(logits, self.ids)
