"""Prefix KV reuse: keep the last generation's KV cache and prefill only what is new.

After each generation we keep the KV cache of its prompt together with the prompt's input
embeddings (`keep`). The next request's input embeddings are compared row by row with them; the
cache is cropped to the longest identical prefix and `generate` prefills only the rest (`take`).
Comparing embeddings rather than ids means two different images (same placeholder ids) can never
match.

The rules (`new_cache` to `cut_reply`) are written twice, here and in the multimodal extension's
`tgw/prefix_cache.py`, because the host imports nothing from extensions and text-generation-webui has
no such module (docs/ARCHITECTURE.md); `tests/test_prefix_cache_rules.py` runs both on the same
caches and fails on any difference. Change both.
- The reply's own rows are dropped: they were computed one token at a time, while the next prompt's
  prefill (and Hugging Face's, on the whole conversation) computes them in one batch, and in bfloat16
  the two differ enough to change greedy tokens (measured at LLaVA-7B's width). Prefilling a reply
  again costs a few dozen tokens; the turn stays token-identical.
- A cache is kept only when `crop` can put it back as it was (`DynamicCache.is_croppable`: no
  linear-attention state), and only once its whole prompt was prefilled.
- Sliding-window layers (Gemma 3, Cohere2) keep only their window's states once the window is full.
  `new_cache` has them record their whole past, but every `crop` trims them to the window again, so a
  cache can be cropped back only to where such a layer still holds a whole window (`shortest_crop`):
  the next turn of the same chat continues it; a regenerated reply or another chat sharing a shorter
  prefix prefills its prompt whole.
- Cross-attention layers (Mllama's, listed in the text config's `cross_attention_layers`) hold the
  images' keys and values, not the prompt's tokens: they are never cropped or counted here; the
  route that fills them decides whether the cache still fits this prompt's images, and a prompt
  without such a route reuses no cache that holds images.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache

from modules import shared
from modules.logging_colors import logger


@dataclass
class Kept:
    model: object  # the model the cache belongs to
    embeds: torch.Tensor  # (tokens, hidden): the rows whose keys/values `cache` holds
    cache: DynamicCache


_kept: Kept | None = None


def clear() -> None:
    global _kept
    _kept = None


def embed_ids(ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return shared.model.get_input_embeddings()(ids)


def take(model, prompt_embeds: torch.Tensor, has_route: bool) -> tuple[DynamicCache, int]:
    """A cache for the prompt whose embeddings are `prompt_embeds` `(n, hidden)`, and how many of its
    leading tokens it already holds (0 for a new, empty cache). `has_route`: the prompt comes with a
    pipeline's route, which decides itself whether a cache's pictures still fit."""
    global _kept
    kept, _kept = _kept, None  # generate() extends it in place: valid again only once kept
    if kept is None or kept.model is not model:
        return new_cache(model), 0
    usable = usable_length(model, kept.cache, kept.embeds, prompt_embeds, has_route)
    if usable == 0:
        return new_cache(model), 0
    crop(model, kept.cache, usable - token_count(model, kept.cache))
    return kept.cache, usable


def keep(model, prompt_embeds: torch.Tensor, cache) -> None:
    """After generate: keep `cache` for the prompt `prompt_embeds` `(n, hidden)`, the reply cut off."""
    global _kept
    if not cut_reply(model, cache, prompt_embeds.shape[0]):
        _kept = None
        logger.debug("Prefix reuse: this generation's KV cache cannot be cropped back to its prompt")
        return
    _kept = Kept(model, prompt_embeds, cache)


# -- The rules, the same in tgw/prefix_cache.py ---------------------------------------------------------

def new_cache(model) -> DynamicCache:
    """An empty cache that can later be cropped; sliding-window layers record their whole past where
    transformers can (5.2x), so that a full window does not stop the crop."""
    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def usable_length(model, cache: DynamicCache, cached_embeds: torch.Tensor, prompt_embeds: torch.Tensor,
                  has_route: bool) -> int:
    """How many leading tokens of the prompt `prompt_embeds` `(n, hidden)` a kept `cache`, whose rows
    are `cached_embeds` `(m, hidden)`, can give it: 0 for none. At least one token is left to prefill
    (generate needs the last token's logits)."""
    if holds_images(model, cache) and not has_route:
        return 0  # its tokens were computed with pictures; only the route knows whether they are this prompt's
    usable = min(common_prefix_length(prompt_embeds, cached_embeds[:token_count(model, cache)]),
                 prompt_embeds.shape[0] - 1)
    return usable if usable > 0 and usable >= shortest_crop(model, cache) else 0


def cut_reply(model, cache, prompt_length: int) -> bool:
    """After generate: crop the reply's rows off `cache`, which holds a prompt of `prompt_length` tokens
    and then the reply; False, the cache left as it was, when it cannot be kept: `crop` cannot undo
    its layers, the prompt was never wholly prefilled, or a sliding window no longer holds its end."""
    if not croppable(cache):
        return False
    held = token_count(model, cache)
    if held < prompt_length or shortest_crop(model, cache) > prompt_length:
        return False
    crop(model, cache, prompt_length - held)
    return True


def croppable(cache) -> bool:
    """Whether `crop` can put `cache` back as it was: a `DynamicCache` without linear-attention state, or
    a static cache whose layers crop by moving their write position (`static_decode.WritePositionCache`)."""
    return isinstance(cache, Cache) and cache.is_croppable


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
    """How many of the prompt's tokens `cache` holds."""
    return max((int(layer.get_seq_length()) for layer in token_layers(model, cache)), default=0)  # static: a tensor


def crop(model, cache: DynamicCache, tokens_to_remove: int) -> None:
    """`crop` (a negative count) on the layers that hold the prompt's tokens. Nothing to remove, no
    call: a full sliding window that does not record its past refuses even `crop(0)`."""
    if tokens_to_remove == 0:
        return
    for layer in token_layers(model, cache):
        layer.crop(tokens_to_remove)


def holds_images(model, cache: DynamicCache) -> bool:
    """Whether `cache`'s cross-attention layers hold pictures' states: then every token it holds was
    computed with those pictures (Mllama's tokens before the first picture attend to all of them)."""
    kept = {id(layer) for layer in token_layers(model, cache)}
    return any(id(layer) not in kept and layer.get_seq_length() > 0 for layer in cache.layers)


def shortest_crop(model, cache: DynamicCache) -> int:
    """The shortest length `cache` can be cropped to and still continue: 0 unless a sliding-window
    layer has dropped states. Such a layer holds the states from `first` on (`first` = its length less
    the states it holds); cropped to a length L it needs the `sliding_window - 1` states before L, so L
    must be at least `first + sliding_window - 1`. Without recording (transformers before 5.2x) that is
    its whole length once the window is full; with it, the length of its last crop."""
    shortest = 0
    for layer in token_layers(model, cache):
        if getattr(layer, "is_sliding", False) and layer.is_initialized and layer.keys is not None:
            first = layer.get_seq_length() - layer.keys.shape[-2]
            if first > 0:
                shortest = max(shortest, first + layer.sliding_window - 1)
    return shortest
