"""What both LLaVA pipeline kinds read from the host: the loaded model's embedding, folder and placement.

Everything here looks at `shared.model` when called, never at import time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from modules import shared

# Keys this package reads from the extension's params, with text-generation-webui's defaults.
# `vision_tower` / `projector_path` point original pipelines at local copies (offline use, tests).
DEFAULT_PARAMS: dict[str, Any] = {
    "vision_device": None,
    "vision_bits": 32,
    "projector_device": None,
    "projector_bits": 32,
    "vision_tower": None,
    "projector_path": None,
}


def with_defaults(params: Optional[dict]) -> dict:
    return {**DEFAULT_PARAMS, **(params or {})}


def require_model() -> Any:
    if shared.model is None:
        raise ValueError("The LLaVA pipelines need the language model loaded first (start with --model NAME).")
    return shared.model


def input_embedding() -> torch.nn.Embedding:
    return require_model().get_input_embeddings()


def model_placement() -> tuple[torch.device, torch.dtype]:
    """Where and in what dtype the LM takes input embeddings."""
    weight = input_embedding().weight
    return weight.device, weight.dtype


def device_or_model(value: Optional[str]) -> torch.device:
    """A `*_device` param: the named device, else the LM's own. (The base class helper would pick
    cuda:0 whenever CUDA exists, even when the host runs the model on the CPU with --cpu.)"""
    return torch.device(value) if value is not None else model_placement()[0]


def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings from the LM's own input embedding: `(..., hidden)` on the LM's device."""
    embedding = input_embedding()
    with torch.inference_mode():
        return embedding(input_ids.to(embedding.weight.device))


def to_model(embeds: torch.Tensor) -> torch.Tensor:
    device, dtype = model_placement()
    return embeds.to(device=device, dtype=dtype)


def model_folder() -> Optional[Path]:
    """The loaded model's folder on disk, or None when it came from elsewhere."""
    name_or_path = getattr(require_model().config, "_name_or_path", "") or ""
    if name_or_path and Path(name_or_path).is_dir():
        return Path(name_or_path)
    from modules.models import resolve_model_path

    try:
        return resolve_model_path(shared.model_name)
    except FileNotFoundError:
        return None


def model_config_dict() -> dict:
    """The folder's config.json as written (original LLaVA keys such as mm_vision_tower survive only there)."""
    folder = model_folder()
    if folder is None or not (folder / "config.json").exists():
        return {}
    from modules.models import read_config_dict

    return read_config_dict(folder)
