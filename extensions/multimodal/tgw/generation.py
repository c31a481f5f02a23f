"""Generation in text-generation-webui for image-text checkpoints: its own loop, this extension's inputs.

text-generation-webui hands `model.generate()` the ids (and `inputs_embeds`) that the tokenizer hook
returned, and nothing else: no Qwen positions, no Gemma 3 token types, no pixels, and no KV cache
between turns. Through its `custom_generate_reply` hook this runs the host's own `generate_reply_HF`
unchanged (its samplers, seed, stopping strings, streaming, stop button, EOS and token bans,
`state['logits_processor']`) and changes only the inputs of its one `generate()` call, as the
tokenizer hook left them in `state`:
- `state[MODEL_ROUTE]` (the fast path): the route's keyword arguments for this prompt, built from
  the pictures' features that the embedder keeps by content (each picture through the vision tower
  once per model), and the KV cache of the previous prompt cropped to what this one shares with it
  (`tgw/prefix_cache.py`), so only new tokens are prefilled;
- `state[PROCESSOR_INPUTS]` (the processor route, where the installed transformers cannot take
  precomputed features of the family): the processor's image tensors; the tower runs in generate.

`custom_generate_reply`'s arguments differ between versions: `(question, original_question, state,
stopping_strings, is_chat=...)` today, with a `seed` before `state` in the versions that shipped the
original extension. They are passed on as they came.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from extensions.multimodal.core.defaults import MODEL_ROUTE, PROCESSOR_INPUTS
from extensions.multimodal.core.loaded_model import placed, placement
from extensions.multimodal.tgw import prefix_cache, static_decode
from modules import shared
from modules.logging_colors import logger
from modules.text_generation import generate_reply_HF  # the host's own generation, in every host


def generate_reply(question: str, original_question: str, *args, caching: bool = True,
                   static_cache: bool | None = None, **kwargs) -> Iterator[str]:
    """`custom_generate_reply`; `caching`: keep the KV cache between turns (the `prefix_cache` setting);
    `static_cache`: decode with a static KV cache (the `static_cache` setting, tgw/static_decode.py)."""
    state = next(arg for arg in args if isinstance(arg, dict))
    model = shared.model
    own = model.__dict__.get("generate")  # an instance attribute (a host's or a tool's wrapper) to restore
    delegate = model.generate

    def generate(*inner_args, **inner_kwargs):
        route = state.pop(MODEL_ROUTE, None)
        if route is None:
            inner_kwargs.update(state.pop(PROCESSOR_INPUTS, None) or {})
            return delegate(*inner_args, **inner_kwargs)
        return generate_on_route(model, delegate, route, inner_kwargs, caching and inner_kwargs.get("use_cache", True),
                                 static_cache, int(state.get("truncation_length") or 0))

    model.generate = generate
    try:
        yield from generate_reply_HF(question, original_question, *args, **kwargs)
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own


def generate_on_route(model, delegate: Callable, route: Callable, kwargs: dict, caching: bool,
                      static_cache: bool | None = None, context: int = 0):
    """`delegate(**kwargs)` with text-generation-webui's inputs (`inputs`, `inputs_embeds`) replaced by
    the route's, and the kept KV cache where `caching`; the cache is kept again afterwards. A static
    cache where `static_cache` (None: tgw/static_decode.py's default) and the family takes one, sized by
    what the prompt and the reply need, at most `context` (the state's truncation_length: `slots`)."""
    ids = kwargs.pop("inputs", None)
    prompt_embeds = kwargs.pop("inputs_embeds")[0]  # (n, hidden)
    static_length = static_decode.cache_length(model, static_cache, context, prompt_embeds.shape[0],
                                               int(kwargs.get("max_new_tokens") or 0))
    cache, reused = prefix_cache.take(model, prompt_embeds, has_route=True) if caching else (None, 0)
    if not caching:
        prefix_cache.clear()
    cache = static_decode.lengthened(cache, static_length)  # a static one too short for this turn
    if not static_decode.fits(cache, static_length):  # none yet, or one kept for the other kind of decoding
        cache = static_decode.new_cache(model, static_length) if static_length is not None \
            else prefix_cache.new_cache(model)
        reused = 0
    elif static_length is not None and ids is not None and static_decode.usable_prefix(model, ids, reused) < reused:
        prefix_cache.crop(model, cache, -reused)
        reused = 0
    device, dtype = placement()
    inputs = {key: placed(value, device, dtype) if isinstance(value, torch.Tensor) else value
              for key, value in route(reused, cache).items()}
    logger.info(f"Multimodal: {prompt_embeds.shape[0] - reused} prompt tokens prefilled, {reused} from the cache")
    cache = inputs.pop("past_key_values", cache)  # Mllama's route prefills a cache itself (cross_attention.py)
    if cache is None:
        return delegate(**kwargs, **inputs)
    try:
        return delegate(**kwargs, **inputs, past_key_values=cache)
    finally:
        if caching:
            prefix_cache.keep(model, prompt_embeds, cache)
