"""The prompt's KV cache, kept between turns where this extension generates in text-generation-webui.

text-generation-webui keeps no KV cache for its Transformers loader: every turn prefills the whole
chat, pictures included. Where the extension generates (`tgw/generation.py`), the KV cache of each
prompt is kept with the prompt's input embeddings (`keep`); the next prompt is compared with them row
by row, the cache cropped to the longest identical prefix, and only the rest prefilled (`take`).

The rules (`new_cache` to `shortest_crop`) are this repository's host's `modules/prefix_cache.py`,
written twice on purpose: the host imports nothing from extensions, and text-generation-webui has no
such module (docs/ARCHITECTURE.md). `tests/test_prefix_cache_rules.py` runs both on the same caches
and fails on any difference; change both. In short:
- embeddings, not ids, are compared: they hold the pictures' features, so two pictures never match;
- the reply's rows are dropped when a cache is kept (they were computed one token at a time; the
  next prompt's prefill, and Hugging Face's, computes them in one batch, which can differ in bf16);
- a cache is kept only when `crop` can put it back as it was, and once its prompt was wholly prefilled;
- a sliding-window layer that has dropped states (a full window; when recording, every crop trims it
  to the window again) can be cropped back only to where it still holds a whole window;
- Mllama's cross-attention layers hold pictures, not tokens: they are never cropped or counted here
  (its route, `hf_auto/cross_attention.py`, decides whether the cache still fits the pictures).
One cache is kept, for the last prompt; `take` hands it out, `keep` takes it back after generate.
The host's module docstring says why each rule holds.
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


def take(model, prompt_embeds: torch.Tensor, has_route: bool) -> tuple[DynamicCache, int]:
    """A cache for the prompt whose embeddings are `prompt_embeds` `(n, hidden)`, and how many of its
    leading tokens it already holds (0 for a new, empty cache). `has_route`: the prompt comes with a
    pipeline's route, which decides itself whether a cache's pictures still fit."""
    global _kept
    with _lock:
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
    kept = Kept(model, prompt_embeds, cache) if cut_reply(model, cache, prompt_embeds.shape[0]) else None
    with _lock:
        _kept = kept


# -- The rules, the same in this repository's modules/prefix_cache.py -----------------------------------

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
    """Whether `crop` can put `cache` back as it was: a `DynamicCache` without linear-attention state
    (transformers 5.2x says so, `is_croppable`; before it, such a layer, one with `conv_states`, took
    `crop` and did nothing)."""
    if not isinstance(cache, DynamicCache):  # tgw/static_decode.py's cache says it is; transformers' StaticCache is not
        return getattr(cache, "is_croppable", False) is True
    if hasattr(cache, "is_croppable"):
        return cache.is_croppable
    return not any(hasattr(layer, "conv_states") for layer in cache.layers)


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
