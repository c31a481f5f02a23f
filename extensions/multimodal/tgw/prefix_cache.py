"""The prompt's KV cache, kept between turns where this extension generates in text-generation-webui.

text-generation-webui keeps no KV cache for its Transformers loader: every turn prefills the whole
chat, pictures included. Where the extension generates (`tgw/generation.py`), the KV cache of each
prompt is kept with the prompt's input embeddings; the next prompt is compared with them row by row,
the cache cropped to the longest identical prefix, and only the rest prefilled. The same rules as
this repository's host's `modules/prefix_cache.py` (written twice on purpose: the host imports
nothing from extensions, and text-generation-webui has no such module; docs/ARCHITECTURE.md):
- embeddings, not ids, are compared: they hold the pictures' features, so two pictures never match;
- the reply's rows are dropped when a cache is kept (they were computed one token at a time; the
  next prompt's prefill, and Hugging Face's, computes them in one batch, which can differ in bf16);
- sliding-window layers that hold a full window cannot be cropped back (transformers refuses, or
  keeps only the window): such a cache continues only where its prompt ended, and one whose reply
  cannot be cropped off is not kept;
- Mllama's cross-attention layers hold pictures, not tokens: they are never cropped or counted here
  (its route, `hf_auto/cross_attention.py`, decides whether the cache still fits the pictures).
One cache is kept, for the last prompt; `take` hands it out, `keep` takes it back after generate.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch
from transformers import DynamicCache


@dataclass
class Kept:
    model: object  # the model the cache belongs to
    embeds: torch.Tensor  # (tokens, hidden): the rows whose keys and values `cache` holds
    cache: DynamicCache


_kept: Optional[Kept] = None
_lock = threading.Lock()  # a stopped generation's thread may still be keeping its cache


def clear() -> None:
    global _kept
    with _lock:
        _kept = None


def new_cache(model) -> DynamicCache:
    """An empty cache that can later be cropped; sliding-window layers record their whole past where
    transformers can (5.2x), so that a full window does not stop the crop."""
    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def take(model, prompt_embeds: torch.Tensor) -> tuple[DynamicCache, int]:
    """A cache for the prompt whose embeddings are `prompt_embeds` `(n, hidden)`, and how many of its
    leading tokens it already holds (0 for a new, empty cache)."""
    global _kept
    with _lock:
        kept, _kept = _kept, None  # generate() extends it in place: valid again only once kept
    if kept is None or kept.model is not model:
        return new_cache(model), 0
    cached = token_count(model, kept.cache)
    usable = min(common_prefix_length(prompt_embeds, kept.embeds[:cached]), prompt_embeds.shape[0] - 1)
    if usable <= 0 or usable < shortest_crop(model, kept.cache):
        return new_cache(model), 0
    crop(model, kept.cache, usable - cached)
    return kept.cache, usable


def keep(model, prompt_embeds: torch.Tensor, cache: DynamicCache) -> None:
    """After generate: keep `cache` for the prompt `prompt_embeds` `(n, hidden)`, the reply cut off."""
    global _kept
    held = token_count(model, cache)
    extra = held - prompt_embeds.shape[0]  # the reply's rows
    if extra < 0 or (extra > 0 and shortest_crop(model, cache) > held - extra):
        return  # the prompt was never wholly prefilled, or the reply cannot be cut off
    if extra > 0:
        crop(model, cache, -extra)
    with _lock:
        _kept = Kept(model, prompt_embeds, cache)


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of leading rows equal in `a` `(n, hidden)` and `b` `(m, hidden)`."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    same = (a[:n] == b[:n].to(a.device, a.dtype)).all(dim=-1)
    mismatch = (~same).nonzero()
    return n if mismatch.numel() == 0 else int(mismatch[0, 0])


def token_layers(model, cache: DynamicCache) -> list:
    """The layers that hold the prompt's tokens: all but the model's cross-attention layers."""
    cross = set(getattr(model.config.get_text_config(), "cross_attention_layers", None) or ())
    return [layer for index, layer in enumerate(cache.layers) if index not in cross]


def token_count(model, cache: DynamicCache) -> int:
    return max((layer.get_seq_length() for layer in token_layers(model, cache)), default=0)


def crop(model, cache: DynamicCache, tokens_to_remove: int) -> None:
    """`crop` (a negative count) on the layers that hold the prompt's tokens."""
    for layer in token_layers(model, cache):
        layer.crop(tokens_to_remove)


def shortest_crop(model, cache: DynamicCache) -> int:
    """The shortest length `cache` can be cropped to: its whole length once a sliding-window layer
    that does not record its past (transformers before 5.2x cannot) holds a full window, else 0."""
    full = any(getattr(layer, "is_sliding", False) and not getattr(layer, "record_past", False)
               and layer.get_seq_length() >= layer.sliding_window for layer in cache.layers)
    return token_count(model, cache) if full else 0
