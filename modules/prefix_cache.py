"""Prefix KV reuse: keep the last generation's KV cache and prefill only what is new.

After each generation we keep the KV cache of its prompt together with the prompt's input
embeddings. The next request's input embeddings are compared row by row with them; the cache is
cropped to the longest identical prefix and `generate` prefills only the rest. Comparing embeddings
rather than ids means two different images (same placeholder ids) can never match. Off when the
cache cannot be cropped.
The reply's own rows are dropped: they were computed one token at a time, while the next prompt's
prefill (and Hugging Face's, on the whole conversation) computes them in one batch, and in bfloat16
the two differ enough to change greedy tokens (measured at LLaVA-7B's width). Prefilling a reply
again costs a few dozen tokens; the turn stays token-identical.
Sliding-window layers (Gemma 3, Cohere2) keep only their window once it is full: such a cache can
still continue where its prompt ended (the next turn of the same chat), but not be cropped back to an
earlier token (another chat sharing a shorter prefix); that prompt is prefilled whole.
Cross-attention layers (Mllama's, listed in the text config's `cross_attention_layers`) hold the
images' keys and values, not the prompt's tokens: they are never cropped or counted here; the
route that fills them decides whether the cache still fits this prompt's images, and a prompt
without such a route reuses no cache that holds images.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from modules import shared
from modules.logging_colors import logger


@dataclass
class CachedPrefix:
    model: object  # the model the cache belongs to
    embeds: torch.Tensor  # (tokens, hidden): the rows whose keys/values `cache` holds
    cache: DynamicCache


_last: CachedPrefix | None = None
stats = {"reused_tokens": 0, "prefilled_tokens": 0}  # counted by modules.model_inputs


def clear() -> None:
    global _last
    _last = None


def embed_ids(ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return shared.model.get_input_embeddings()(ids)


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of leading rows equal in `a` (n, hidden) and `b` (m, hidden)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    same = (a[:n] == b[:n].to(a.device, a.dtype)).all(dim=-1)
    mismatch = (~same).nonzero()
    return n if mismatch.numel() == 0 else int(mismatch[0, 0])


def reusable_cache(prompt_embeds: torch.Tensor) -> DynamicCache | None:
    """The kept cache cropped to the longest prefix shared with `prompt_embeds` (n, hidden), or None."""
    global _last
    if _last is None or _last.model is not shared.model:
        return None
    cached_len = token_count(_last.cache)
    usable = min(common_prefix_length(prompt_embeds, _last.embeds[:cached_len]), prompt_embeds.shape[0] - 1)
    if usable <= 0:
        _last = None
        return None
    cache = _last.cache
    _last = None  # generate() extends the cache in place: it is only valid again once remembered
    if usable < shortest_crop(cache):
        return None
    crop(cache, usable - cached_len)
    return cache


def token_layers(cache: DynamicCache) -> list:
    """The layers that hold the prompt's tokens: all but the model's cross-attention layers."""
    cross = set(getattr(shared.model.config.get_text_config(), "cross_attention_layers", None) or ())
    return [layer for index, layer in enumerate(cache.layers) if index not in cross]


def token_count(cache: DynamicCache) -> int:
    """How many of the prompt's tokens `cache` holds."""
    return max((layer.get_seq_length() for layer in token_layers(cache)), default=0)


def crop(cache: DynamicCache, tokens_to_remove: int) -> None:
    """`cache.crop(tokens_to_remove)` (a negative count) on the layers that hold the prompt's tokens."""
    for layer in token_layers(cache):
        layer.crop(tokens_to_remove)


def holds_images(cache: DynamicCache) -> bool:
    """Whether `cache`'s cross-attention layers hold pictures' states: then every token it holds was
    computed with those pictures (Mllama's tokens before the first picture attend to all of them), and
    only a route that knows this prompt's pictures can tell whether it may be reused."""
    kept = {id(layer) for layer in token_layers(cache)}
    return any(id(layer) not in kept and layer.get_seq_length() > 0 for layer in cache.layers)


def shortest_crop(cache: DynamicCache) -> int:
    """The shortest length `cache` can be cropped to: its whole length once a sliding-window layer
    holds a full window (its `crop` keeps only the window's last states), else 0."""
    full_window = any(getattr(layer, "is_sliding", False) and layer.get_seq_length() >= layer.sliding_window
                      for layer in cache.layers)
    return token_count(cache) if full_window else 0


def remember(prompt_embeds: torch.Tensor, cache) -> None:
    """Keep `cache`, cropped to the prompt whose embeddings are `prompt_embeds` (n, hidden), after a generation."""
    global _last
    if not isinstance(cache, DynamicCache) or not cache.is_croppable:
        _last = None
        logger.debug("Prefix reuse off: this model's KV cache cannot be cropped")
        return
    extra = token_count(cache) - prompt_embeds.shape[0]  # the reply's rows
    if extra > 0:
        crop(cache, -extra)
    _last = CachedPrefix(shared.model, prompt_embeds, cache)
