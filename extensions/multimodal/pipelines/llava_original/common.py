"""What the original LLaVA pipelines (`original.py`) need of the loaded model: its embedding, placement
and config.

Everything here looks at `shared.model` when called, never at import time; the model itself is
read through `extensions/multimodal/loaded_model.py` (names every host has).
"""
from __future__ import annotations

from typing import Optional

import torch

from extensions.multimodal import loaded_model


def model_placement() -> tuple[torch.device, torch.dtype]:
    """Where and in what dtype the LM takes input embeddings."""
    return loaded_model.placement()


def device_or_model(value: Optional[str]) -> torch.device:
    """A `*_device` param: the named device, else the LM's own. (The base class helper would pick
    cuda:0 whenever CUDA exists, even when the host runs the model on the CPU with --cpu.)"""
    return torch.device(value) if value is not None else model_placement()[0]


def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings from the LM's own input embedding: `(..., hidden)` on the LM's device."""
    embedding = loaded_model.input_embedding()
    with torch.inference_mode():
        return embedding(input_ids.to(embedding.weight.device))


def to_model(embeds: torch.Tensor) -> torch.Tensor:
    device, dtype = model_placement()
    return embeds.to(device=device, dtype=dtype)


def model_config_dict() -> dict:
    """The folder's config.json as written (original LLaVA keys such as mm_vision_tower survive only there)."""
    return loaded_model.config_dict()
