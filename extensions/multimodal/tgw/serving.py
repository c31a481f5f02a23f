"""How the extension serves today's image-text checkpoints in text-generation-webui.

Text-generation-webui builds `generate()`'s inputs itself from ids or embeddings. For a transformers
image-text checkpoint (a pipeline module says so: its optional `serves(model)`), the extension
generates instead (`extension_generates`; tgw/generation.py), on one of two routes:
- the fast path, where the pipeline's features are exact with the installed transformers: the
  embedder's ids, embeddings and route, as in this repository's host;
- the processor route elsewhere (`processor_route`): the tokenizer hook hands text-generation-webui
  the processor's ids and leaves its other tensors in `state[PROCESSOR_INPUTS]`; the pipeline's
  `processor_inputs` builds them.
This module knows no family: the pipeline does.
"""
from __future__ import annotations

import weakref

import torch

from extensions.multimodal.core import image_budget, loaded_model, served_model
from extensions.multimodal.core.defaults import PROCESSOR_INPUTS, max_image_pixels, wants_bos
from extensions.multimodal.core.pipeline_loader import module_capability
from modules import shared
from modules.logging_colors import logger


_decided: tuple = (None, False)  # (the model, whether the extension generates for it)
_last_inputs: tuple = (None, None)  # (the key of route_inputs' last call, its result)


def extension_generates(params: dict) -> bool:
    """Whether the extension generates for the loaded model: an image-text checkpoint, in a host that
    builds `generate()`'s inputs itself. Decided once per model: every hook asks, and finding the
    capability imports the pipeline modules (a broken third-party one would log its traceback each time)."""
    global _decided
    if shared.model is None or loaded_model.host_builds_routes():
        return False
    model, generates = _decided
    if model is not shared.model:
        serves = module_capability(params, "serves")
        generates = bool(serves is not None and serves(shared.model))
        _decided = (shared.model, generates)
    return generates


def processor_route(params: dict) -> bool:
    """Whether the loaded model takes its pictures through its processor and `generate()` (the tower inside
    generate, every turn): where the extension generates and the pipeline's features are not exact here."""
    if not extension_generates(params):
        return False
    return not served_model.embedder(params).pipeline.features_exact_here()


def route_inputs(tagged: str, state: dict, params: dict):
    """The processor's inputs for `tagged`, its pictures at the message's or the setting's budget.

    The last result is kept: text-generation-webui measures the prompt (`custom_tokenized_length`) and
    then hands the same prompt to the tokenizer hook; the processor (decoding and preparing every
    picture) runs once for both. Callers must not modify the result."""
    global _last_inputs
    pipeline = served_model.embedder(params).pipeline
    settings = (tagged, wants_bos(state), max_image_pixels(params), image_budget.resolve(state, params))
    key = (weakref.ref(pipeline), *settings)  # a model given up is not kept alive by its last inputs
    last = _last_inputs  # read once: another session's turn may replace it meanwhile
    if last[0] == key:
        return last[1]
    inputs = pipeline.processor_inputs(*settings)
    _last_inputs = (key, inputs)
    return inputs


def processor_route_ids(tagged: str, state: dict, params: dict) -> torch.Tensor:
    """The processor's ids for `tagged`; its other tensors go to `state[PROCESSOR_INPUTS]` for generate()."""
    inputs = route_inputs(tagged, state, params)
    device, dtype = loaded_model.placement()
    tensors = {key: loaded_model.placed(value, device, dtype) for key, value in inputs.items()}
    ids = tensors.pop("input_ids")
    state[PROCESSOR_INPUTS] = tensors
    logger.info(f"Multimodal: {ids.shape[-1]} prompt tokens through {type(loaded_model.processor()).__name__}")
    return ids
