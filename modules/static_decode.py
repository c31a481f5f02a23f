"""Decoding with a static KV cache, which transformers compiles on a GPU.

In: the loaded model, the generation state and the prompt's length. Out: `cache_length(...)`, the
number of slots of the static cache to generate with (None: keep the dynamic cache),
`new_cache(length)`, an empty one, and `lengthened(cache, length)`, a kept one given more slots with
its rows. This module does not generate; `modules/model_inputs.py` passes
the cache to `generate()`, and `modules/prefix_cache.py` keeps it between turns like a dynamic one.

On or off: the `static_cache` setting (a state key: settings.yaml can set it), else `--static-cache`;
with neither, `DEFAULT_ON_CUDA` on a CUDA device and off elsewhere.
With a static cache on CUDA, transformers' `generate` compiles each decoding step's forward itself
(`GenerationMixin._valid_auto_compile_criteria`: a compileable cache that is not a `DynamicCache`,
on cuda/xpu/tpu, unless `generation_config.compile_config` says `_compile_all_devices`); on a CPU it
runs the static cache eagerly, attending over every slot at each step, which is slower than the
dynamic cache: a CPU keeps the dynamic cache by default.

One layout for every family that takes it: each layer, sliding-window ones included, holds `length`
slots (`WritePositionLayer`). A sliding window is then the attention mask's business (transformers
masks by absolute position), not the cache's, so any prefix of the previous prompt can be kept: a
static cache cannot be cut, but "cropping" it only moves its write position back; the slots past it
are masked until the next prefill overwrites them. The kept prefix is the dynamic cache's rule
(`modules/prefix_cache.py`: the reply's rows dropped, only new tokens prefilled).
Families: those in `FAMILIES` (tested against the eager dynamic path and Hugging Face's generate,
`tests/test_static_decode.py`); another family keeps the dynamic cache, said once in the log.
`extensions/multimodal/tgw/static_decode.py` is the same for text-generation-webui (written twice:
docs/ARCHITECTURE.md, "Concerns written twice on purpose").
"""
from __future__ import annotations

import sys
import threading
from collections import defaultdict

import torch
from transformers import Cache
from transformers.cache_utils import StaticLayer

from modules import shared
from modules.logging_colors import logger

# On a CUDA device where transformers compiles the step, the static cache is the default (the setting or
# --static-cache aside): an H200 run (tools/gpu_check.sh, README "On an H200") showed every family's replies
# the dynamic path's in fp32 over a three-turn chat, and decode 3.1 times as fast at LLaVA-1.5-7B in bf16.
DEFAULT_ON_CUDA = True
# model_type of the checkpoints whose language model decodes exactly with this cache.
FAMILIES = frozenset({"llava", "llava_next", "llava_onevision", "qwen2_5_vl", "gemma3"})
# Families whose pictures attend to each other both ways through `token_type_ids` (see `usable_prefix`).
MASK_FROM_TOKEN_TYPES = frozenset({"gemma3"})
# Slots: what the prompt and the reply need, doubled from MIN_SLOTS, at most the context in whole
# BLOCKs (`slots`). Each step attends over every slot (a 4096-slot cache at LLaVA-1.5-7B's shapes reads
# 2.1 GB a step beside its 13.2 GB of weights), and a context can be 128K tokens (Qwen2.5-VL, Gemma 3:
# 18 GB of cache for Gemma 3 4B). A new length is not a compile each: the first length's step compiles
# with static shapes (tens of seconds at 7B on a GPU), the second once more with the length as a symbol
# (torch's automatic dynamic shapes, under transformers' default compile config), and that graph serves
# every later length (tests/test_static_compile.py). A kept cache too short for the next turn moves its
# rows into a longer one (`lengthened`).
MIN_SLOTS = 4096
BLOCK = 256
_told: set[str] = set()  # families already said to keep the dynamic cache
_lengths_told: set[tuple[str, int]] = set()  # (checkpoint, slots) already logged


def graphs_on_this_thread() -> None:
    """Lets a compiled step replay CUDA graphs on the calling thread (the host's compute thread, before
    each `generate`).

    torch records them through cudagraph trees, whose manager lives in thread-local storage that only
    the thread that imported them (and autograd's threads) start with; on any other thread the compiled
    step fails with a bare AssertionError in `cudagraph_trees.get_obj` (seen on an H200, torch 2.11).
    All generation runs on one long-lived thread, which gets a manager of its own. Nothing is imported
    here: where no thread has imported them yet, the compile that will runs on this thread (importing
    torch's inductor on this thread, on a CPU, aborted one exit in four)."""
    cudagraph_trees = sys.modules.get("torch._inductor.cudagraph_trees")
    local = getattr(cudagraph_trees, "local", None)
    if local is not None and not hasattr(local, "tree_manager_containers"):
        local.tree_manager_containers = {}
        local.tree_manager_locks = defaultdict(threading.Lock)


class WritePositionLayer(StaticLayer):
    """A `StaticLayer` that can be cropped: cropping moves its write position back (in place: a
    compiled step holds the tensor's address)."""

    is_croppable = True

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` tokens (a count <= 0, as `DynamicLayer.crop` takes it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove < 0 and self.is_initialized:
            self.cumulative_length.sub_(-int(tokens_to_remove))


class WritePositionCache(Cache):
    """`layers` full-length `WritePositionLayer`s of `length` slots each."""

    is_croppable = True  # every layer is (transformers 5.2x's Cache says so from its layers; older ones have no such flag)

    def __init__(self, layers: int, length: int):
        super().__init__(layers=[WritePositionLayer(max_cache_len=length) for _ in range(layers)])
        self.length = length


def enabled(state: dict) -> bool:
    """The state's `static_cache` (True/False); unset, `--static-cache`, else the device's default."""
    setting = state.get("static_cache")
    if setting is None and shared.args.static_cache:
        setting = True
    if setting is None:
        # The language model's device: `model.device` is the first parameter's, for most families the
        # vision tower's, which the card's vision_device may put on a GPU beside a language model on the CPU.
        # Uncompiled (CPU offload, the compiler off), each step would attend over every slot: slower.
        on_cuda = shared.model.get_input_embeddings().weight.device.type == "cuda"
        return DEFAULT_ON_CUDA and on_cuda and compiles(shared.model)
    return bool(setting)


def takes_static_cache(model) -> bool:
    """Whether `model`'s family decodes with `WritePositionCache`; logs once per family when not."""
    family = model.config.model_type
    if family in FAMILIES:
        return True
    if family not in _told:
        _told.add(family)
        logger.info(f"Static cache: {family} keeps the dynamic KV cache (static decoding covers "
                    f"{', '.join(sorted(FAMILIES))})")
    return False


def cache_length(state: dict, prompt_tokens: int) -> int | None:
    """Slots of the static cache for this generation (`slots`), or None for the dynamic cache."""
    if not enabled(state) or not takes_static_cache(shared.model):
        return None
    length = slots(int(state["truncation_length"]), prompt_tokens + int(state["max_new_tokens"]))
    tell_length(shared.model, length)
    return length


def tell_length(model, length: int) -> None:
    """Logs each checkpoint's cache length once: where transformers compiles, the first reply at a new
    length waits for it (the first two lengths; tens of seconds at 7B), which would look like a hang."""
    key = (str(getattr(model.config, "_name_or_path", "")), length)
    if key in _lengths_told:
        return
    _lengths_told.add(key)
    wait = " (transformers compiles the decoding step at the first two lengths: such a reply waits for it)" \
        if compiles(model) else ""
    logger.info(f"Static cache: {model.config.model_type} decodes with {length} slots{wait}")


def compiles(model) -> bool:
    """Whether `generate` compiles this cache's step: transformers' own rule (a CUDA device, no CPU offload,
    a quantization that allows it...), unless torch's compiler is off for this thread."""
    rule = getattr(model, "_valid_auto_compile_criteria", None)
    if rule is None or not rule({"past_key_values": WritePositionCache(1, BLOCK)}, model.generation_config):
        return False
    import torch._dynamo  # only where it compiles: the compiler's import is not free

    return not torch._dynamo.config.disable


def slots(context: int, needed: int) -> int:
    """The first of MIN_SLOTS, twice that, ... that holds `needed` tokens, or the context (`truncation_length`)
    in whole blocks where that is less, or `needed` in whole blocks where the context is too short."""
    size = MIN_SLOTS
    while size < needed:
        size *= 2
    return min(size, -(-max(context, needed) // BLOCK) * BLOCK)


def usable_prefix(model, input_ids: torch.Tensor, reused: int) -> int:
    """How many of the `reused` tokens a static cache may keep for the prompt `input_ids` `(1, n)`: all,
    except on Gemma 3 when a picture is among the tokens to prefill. With a static cache transformers
    (5.23) builds Gemma 3's attention mask in `prepare_inputs_for_generation` from `token_type_ids`
    cut to the tokens being prefilled, then reads them by absolute position: that picture's tokens would
    lose their attention to each other both ways. Such a prompt is prefilled whole (a picture turn runs
    the vision tower anyway); a text turn after it keeps the prefix."""
    if reused == 0 or model.config.model_type not in MASK_FROM_TOKEN_TYPES:
        return reused
    image = getattr(model.config, "image_token_id", None)
    return 0 if image is not None and bool((input_ids[:, reused:] == image).any()) else reused


def new_cache(length: int) -> WritePositionCache:
    return WritePositionCache(shared.model.config.get_text_config(decoder=True).num_hidden_layers, length)


def fits(cache: Cache, length: int | None) -> bool:
    """Whether a kept `cache` is the kind this generation decodes with: a static one of at least `length`
    slots (a longer one is kept: its step is compiled already), or a dynamic one for None."""
    if length is None:
        return not isinstance(cache, WritePositionCache)
    return isinstance(cache, WritePositionCache) and cache.length >= length


def lengthened(cache: Cache, length: int | None) -> Cache:
    """`cache`, or where it is a static one shorter than `length`, a new one of `length` slots holding
    its rows (the kept prefix stays kept: on a GPU a long chat's prefill costs tens of milliseconds)."""
    if length is None or not isinstance(cache, WritePositionCache) or cache.length >= length:
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
