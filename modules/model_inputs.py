"""`generate()`'s inputs, built in one place from what the tokenizer hook returned.

In: the prompt's ids `[1, n]` and, when an extension returned them, its input embeddings
`[1, n, hidden]`. Out: keyword arguments for `model.generate`: `input_ids` or `inputs_embeds` on the
model's device (embeddings in the model's dtype), an all-ones attention mask, and, when the prefix
cache is on, the KV cache kept from the previous generation cropped to the shared prefix
(`modules.prefix_cache`); plus the prompt's embeddings `(n, hidden)` to remember afterwards.
Every generation goes through `generate_inputs`. This module does not tokenize or sample.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from modules import prefix_cache, shared


def generate_inputs(input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None,
                    use_prefix_cache: bool) -> tuple[dict, torch.Tensor | None]:
    """(`generate()` keyword arguments, the prompt's embeddings `(n, hidden)` or None when reuse is off)."""
    weight = shared.model.get_input_embeddings().weight
    input_ids = input_ids.to(weight.device)
    if inputs_embeds is not None:
        inputs_embeds = inputs_embeds.to(weight.device, weight.dtype)
    kwargs: dict = {"input_ids": input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
    length = input_ids.shape[-1] if inputs_embeds is None else inputs_embeds.shape[1]
    # Image placeholder ids often equal the pad id; without an explicit mask transformers masks them.
    kwargs["attention_mask"] = torch.ones((1, length), dtype=torch.long, device=weight.device)
    if not use_prefix_cache:
        prefix_cache.clear()
        return kwargs, None
    prompt_embeds = (inputs_embeds if inputs_embeds is not None else prefix_cache.embed_ids(input_ids))[0]
    cache = prefix_cache.reusable_cache(prompt_embeds)
    kwargs["past_key_values"] = cache if cache is not None else DynamicCache(config=shared.model.config)
    reused = cache.get_seq_length() if cache is not None else 0
    prefix_cache.stats["reused_tokens"] += reused
    prefix_cache.stats["prefilled_tokens"] += length - reused
    return kwargs, prompt_embeds
