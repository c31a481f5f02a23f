"""`generate()`'s inputs, built in one place from what the tokenizer hook returned.

In: the prompt's ids `[1, n]` and, when an extension returned them, its input embeddings
`[1, n, hidden]`; and the route an extension may leave in `state[MODEL_ROUTE]` from its
`tokenizer_modifier`: a function of how many leading tokens the prefix cache already holds, and of
that cache (None when reuse is off), that gives the keyword arguments the model needs for this
prompt (a model that takes more than stitched embeddings: Qwen2-VL's 3-D positions, Gemma 3's
image features beside its ids; Mllama's route prefills the cache itself with its images' states).
Out: keyword arguments for `model.generate`: by default `input_ids`, with `inputs_embeds` when
given, on the model's device (embeddings in the model's dtype) and an all-ones attention mask;
when the prefix cache is on, the KV cache kept from the previous generation cropped to the shared
prefix (`modules.prefix_cache`, which compares the embeddings: they hold the images' features, so
two pictures never match); plus the prompt's embeddings `(n, hidden)` to remember afterwards.
Every generation goes through `generate_inputs`. This module does not tokenize or sample.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from transformers import Cache, DynamicCache

from modules import prefix_cache, shared, static_decode

MODEL_ROUTE = "model_route"


Route = Callable[[int, Optional[DynamicCache]], dict]


def generate_inputs(input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None, use_prefix_cache: bool,
                    route: Optional[Route] = None,
                    static_length: int | None = None) -> tuple[dict, torch.Tensor | None]:
    """(`generate()` keyword arguments, the prompt's embeddings `(n, hidden)` or None when reuse is off).
    `static_length`: decode with a static cache of that many slots (`modules/static_decode.py`), kept
    between turns as the dynamic one is; None: the dynamic cache."""
    weight = shared.model.get_input_embeddings().weight
    input_ids = input_ids.to(weight.device)
    if inputs_embeds is not None:
        inputs_embeds = inputs_embeds.to(weight.device, weight.dtype)
    prompt_embeds, cache, reused = None, None, 0
    if use_prefix_cache:
        prompt_embeds = (inputs_embeds if inputs_embeds is not None else prefix_cache.embed_ids(input_ids))[0]
        cache, reused = prefix_cache.take(shared.model, prompt_embeds, has_route=route is not None)
        cache = static_decode.lengthened(cache, static_length)  # a static one too short for this turn
        if not static_decode.fits(cache, static_length):  # a new cache, or one kept before the setting changed
            cache, reused = new_cache(static_length), 0
        elif static_length is not None and static_decode.usable_prefix(shared.model, input_ids, reused) < reused:
            prefix_cache.crop(shared.model, cache, -reused)
            reused = 0
    else:
        prefix_cache.clear()
        cache = static_decode.new_cache(static_length) if static_length is not None else None
    kwargs = on_device(route(reused, cache if use_prefix_cache else None), weight.device) if route is not None \
        else default_inputs(input_ids, inputs_embeds, weight.device)
    if cache is not None:
        kwargs["past_key_values"] = cache
    return kwargs, prompt_embeds


def new_cache(static_length: int | None) -> Cache:
    """An empty cache that can later be cropped: static with `static_length` slots, else dynamic."""
    if static_length is not None:
        return static_decode.new_cache(static_length)
    return prefix_cache.new_cache(shared.model)


def default_inputs(input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None, device: torch.device) -> dict:
    # The ids go along with embeddings (as text-generation-webui's generate(inputs=ids, inputs_embeds=...)):
    # logits processors that read the prompt, such as a checkpoint's repetition_penalty, see it.
    kwargs: dict = {"input_ids": input_ids} if inputs_embeds is None else \
        {"input_ids": input_ids, "inputs_embeds": inputs_embeds}
    length = input_ids.shape[-1] if inputs_embeds is None else inputs_embeds.shape[1]
    # Image placeholder ids often equal the pad id; without an explicit mask transformers masks them.
    kwargs["attention_mask"] = torch.ones((1, length), dtype=torch.long, device=device)
    return kwargs


def on_device(kwargs: dict, device: torch.device) -> dict:
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()}
