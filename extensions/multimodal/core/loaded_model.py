"""The loaded language model as the extension sees it, through names every host has.

The extension runs in this repository's host and in text-generation-webui, old and current. Of the
host it uses only `modules.shared` (`args`, `model`, `tokenizer`, `model_name`); what
else it needs of the model - where its inputs go, its folder and config.json, its pad ids, its
processor - is worked out here, from the model itself, so every host gets the same.
Everything is read when called, never at import time.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

import torch

from modules import shared


@functools.cache  # the host does not change while it runs
def host_builds_routes() -> bool:
    """Whether the host builds `generate()`'s inputs from the route an extension leaves in the state
    (this repository's `modules.model_inputs`); text-generation-webui takes ids or embeddings only."""
    import importlib.util

    return importlib.util.find_spec("modules.model_inputs") is not None


def require_model() -> Any:
    if shared.model is None:
        raise ValueError("The multimodal extension needs the language model loaded first (load a model, then the extension).")
    return shared.model


def tokenizer() -> Any:
    return shared.tokenizer


def identity() -> tuple:
    """The loaded (model, tokenizer): caches of ids and rows hold for one pair only."""
    return shared.model, shared.tokenizer


def input_embedding() -> torch.nn.Embedding:
    return require_model().get_input_embeddings()


def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings from the LM's own input embedding: `(..., hidden)` on the LM's device."""
    embedding = input_embedding()
    with torch.inference_mode():
        return embedding(input_ids.to(embedding.weight.device))


def placed(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` on `device`; floating-point tensors in `dtype` too (ids and grids keep theirs)."""
    return tensor.to(device, dtype) if tensor.is_floating_point() else tensor.to(device)


def placement() -> tuple[torch.device, torch.dtype]:
    """Where, and in what dtype, the model takes input embeddings."""
    weight = input_embedding().weight
    return weight.device, weight.dtype


def model_device() -> torch.device:
    return placement()[0]


def model_folder() -> Optional[Path]:
    """The loaded model's folder on disk, or None when it came from elsewhere (e.g. the hub cache)."""
    name_or_path = getattr(require_model().config, "_name_or_path", "") or ""
    if name_or_path and Path(name_or_path).is_dir():
        return Path(name_or_path)
    model_dir = getattr(shared.args, "model_dir", None)
    name = str(getattr(shared, "model_name", "") or "")
    for candidate in ([Path(model_dir) / name] if model_dir and name else []) + ([Path(name)] if name else []):
        if candidate.is_dir():
            return candidate
    return None


def config_dict() -> dict:
    """The folder's config.json as written (original LLaVA keys such as mm_vision_tower survive only there)."""
    folder = model_folder()
    if folder is None or not (folder / "config.json").is_file():
        return {}
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def pad_token_ids() -> set[int]:
    """Every id a host may take for padding: text-generation-webui passes no attention mask, so
    `generate()` masks each input position holding the generation config's pad id."""
    model = require_model()
    sources = [getattr(shared.tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None),
               getattr(getattr(model, "generation_config", None), "pad_token_id", None)]
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    sources.append(getattr(text_config, "pad_token_id", None))
    return {int(i) for i in sources if isinstance(i, int)}


_processor_cache: dict[int, Any] = {}


def processor() -> Any:
    """The model's processor, loaded from the model's folder once (`processor_loading`: as is where
    torchvision works, else built from the checkpoint's PIL parts)."""
    model = require_model()
    if id(model) not in _processor_cache:
        folder = model_folder()
        if folder is None:
            raise ValueError("The model's processor is needed, but the model's folder was not found "
                             f"(model name {shared.model_name!r}).")
        from extensions.multimodal.core.processor_loading import load_processor

        _processor_cache.clear()  # one model at a time
        _processor_cache[id(model)] = load_processor(folder)
    return _processor_cache[id(model)]
