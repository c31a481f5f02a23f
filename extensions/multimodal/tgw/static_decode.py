"""Decoding with a static KV cache where this extension generates in text-generation-webui.

This repository's host does the same in `modules/static_decode.py`, whose docstring says why each
rule holds; the two are written twice on purpose (the host imports nothing from extensions, and
text-generation-webui has no such module: docs/ARCHITECTURE.md), and `tests/test_static_decode.py`
checks that they agree. Change both. In short: every layer, sliding-window ones too, a full-length
static layer that crops by moving its write position back, so `tgw/prefix_cache.py` keeps it between
turns like a dynamic cache; `FAMILIES` only, another family keeps the dynamic cache (one log line);
on Gemma 3 a prompt whose uncached tokens hold a picture is prefilled whole.

On or off: the extension's `static_cache` param (None: `DEFAULT_ON_CUDA` on a CUDA device). Whether
text-generation-webui compiles the decode step depends on its torch: its Transformers loader sets
`torch._dynamo.config.disable = True` when it loads a model, which before torch 2.13 holds for the
process (the step runs eagerly), and from torch 2.13 only for the loading thread (a `ContextVar`), not
the one that generates (README, "Today's image-text checkpoints in text-generation-webui 1dcde41d").
transformers without `StaticLayer` (before 5.x) keeps the dynamic cache.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers import Cache

from modules.logging_colors import logger

try:
    from transformers.cache_utils import StaticLayer
except ImportError:  # transformers 4.x: no layered caches
    StaticLayer = None

# Off, unlike the host's: an H200 run showed the host's compiled static path exact and faster, but none has
# run it inside text-generation-webui, where the compiler is off before torch 2.13 (the step would run
# eagerly: slower) and from 2.13 compiles on a new thread each reply. Opt in with `static_cache: true`.
DEFAULT_ON_CUDA = False
FAMILIES = frozenset({"llava", "llava_next", "llava_onevision", "qwen2_5_vl", "gemma3"})
MASK_FROM_TOKEN_TYPES = frozenset({"gemma3"})
MIN_SLOTS = 4096  # slots: the need doubled from this, at most the context (modules/static_decode.py says why)
BLOCK = 256
_told: set[str] = set()
_lengths_told: set[tuple[str, int]] = set()  # (checkpoint, slots) already logged

if StaticLayer is not None:
    class WritePositionLayer(StaticLayer):
        """A `StaticLayer` cropped by moving its write position back (in place)."""

        is_croppable = True

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
            if tokens_to_remove < 0 and self.is_initialized:
                self.cumulative_length.sub_(-int(tokens_to_remove))

    class WritePositionCache(Cache):
        """`layers` full-length `WritePositionLayer`s of `length` slots each."""

        is_croppable = True

        def __init__(self, layers: int, length: int):
            super().__init__(layers=[WritePositionLayer(max_cache_len=length) for _ in range(layers)])
            self.length = length
else:
    WritePositionCache = None


def enabled(model, setting: Optional[bool]) -> bool:
    if setting is None:
        # The language model's device, not `model.device` (the first parameter's: often the vision tower's).
        return DEFAULT_ON_CUDA and model.get_input_embeddings().weight.device.type == "cuda"
    return bool(setting)


def takes_static_cache(model) -> bool:
    family = model.config.model_type
    if family in FAMILIES and WritePositionCache is not None:
        return True
    if family not in _told:
        _told.add(family)
        why = f"static decoding covers {', '.join(sorted(FAMILIES))}" if WritePositionCache is not None else \
            "this transformers has no static cache layers"
        logger.info(f"Static cache: {family} keeps the dynamic KV cache ({why})")
    return False


def cache_length(model, setting: Optional[bool], context: int, prompt_tokens: int, new_tokens: int) -> Optional[int]:
    """Slots of the static cache for this generation (`slots`), or None for the dynamic cache."""
    if not enabled(model, setting) or not takes_static_cache(model):
        return None
    length = slots(context, prompt_tokens + new_tokens)
    tell_length(model, length)
    return length


def tell_length(model, length: int) -> None:
    """Logs each checkpoint's cache length once (where the step compiles, that reply waits for it)."""
    key = (str(getattr(model.config, "_name_or_path", "")), length)
    if key in _lengths_told:
        return
    _lengths_told.add(key)
    wait = " (transformers compiles the decoding step at the first two lengths: such a reply waits for it)" \
        if compiles(model) else ""
    logger.info(f"Static cache: {model.config.model_type} decodes with {length} slots{wait}")


def compiles(model) -> bool:
    """transformers' own rule, unless the compiler is off for this thread: text-generation-webui's loader
    switches it off, for the whole process before torch 2.13 and for the loading thread only from 2.13."""
    rule = getattr(model, "_valid_auto_compile_criteria", None)
    if rule is None or not rule({"past_key_values": WritePositionCache(1, BLOCK)}, model.generation_config):
        return False
    import torch._dynamo

    return not torch._dynamo.config.disable


def slots(context: int, needed: int) -> int:
    """The first of MIN_SLOTS, twice that, ... that holds `needed`, or the context in whole blocks where
    that is less, or `needed` in whole blocks where the context is too short."""
    size = MIN_SLOTS
    while size < needed:
        size *= 2
    return min(size, -(-max(context, needed) // BLOCK) * BLOCK)


def new_cache(model, length: int):
    return WritePositionCache(model.config.get_text_config(decoder=True).num_hidden_layers, length)


def fits(cache, length: Optional[int]) -> bool:
    """A static cache of at least `length` slots (a longer one's step is compiled already), or a dynamic one for None."""
    if length is None:
        return WritePositionCache is None or not isinstance(cache, WritePositionCache)
    return isinstance(cache, WritePositionCache) and cache.length >= length


def lengthened(cache, length: Optional[int]):
    """`cache`, or where it is a static one shorter than `length`, a new one of `length` slots holding its rows."""
    if length is None or WritePositionCache is None or not isinstance(cache, WritePositionCache) \
            or cache.length >= length:
        return cache
    longer = WritePositionCache(len(cache.layers), length)
    for old, new in zip(cache.layers, longer.layers):
        if old.is_initialized:
            rows = int(old.cumulative_length)
            new.lazy_initialization(old.keys, old.values)
            new.keys[:, :, :rows].copy_(old.keys[:, :, :rows])
            new.values[:, :, :rows].copy_(old.values[:, :, :rows])
            new.cumulative_length.fill_(rows)
    return longer


def usable_prefix(model, input_ids: torch.Tensor, reused: int) -> int:
    if reused == 0 or model.config.model_type not in MASK_FROM_TOKEN_TYPES:
        return reused
    image = getattr(model.config, "image_token_id", None)
    return 0 if image is not None and bool((input_ids[:, reused:] == image).any()) else reused
