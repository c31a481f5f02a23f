"""A picture budget (`image_budget.Budget`) as the family's own processor keyword arguments.

They go into every processor call for the prompt's pictures (`images_kwargs`), so a picture laid out
and embedded under a budget is what Hugging Face's `processor(text, images, **kwargs)` gives with the
same arguments. Only knobs a processor honours per call are used (measured on transformers 5.23 and
5.6: the token count follows them and `generate` runs):
- Qwen2-VL, Qwen2.5-VL, Qwen3-VL: `size` {shortest_edge, longest_edge}: the pixel range per picture;
- Idefics3, SmolVLM: `size` {longest_edge}: a multiple of the tile side, at most 6 tiles a side;
- InternVL, Aya Vision: `max_patches`: tiles per picture;
- Mistral 3: `size` {longest_edge}, never above the vision tower's size;
- Gemma 3: `do_pan_and_scan` for "high" (crops beside the whole picture); it has no lower setting.
LLaVA, LLaVA-NeXT, LLaVA-OneVision and Mllama take none per call (their grid and tiles are read
from the processor's own attributes, not from the call): they read every picture the same way.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

MAX_TILES_PER_SIDE = 6  # Idefics3's row/column tokens go up to 6


def qwen(image_processor, budget) -> dict:
    low, high = image_processor.size["shortest_edge"], image_processor.size["longest_edge"]
    cap = max(budget.pixels, high) if budget.at_least_default else budget.pixels
    return {"size": {"shortest_edge": min(low, cap), "longest_edge": cap}}


def idefics3(image_processor, budget) -> dict:
    tile, default = image_processor.max_image_size["longest_edge"], image_processor.size["longest_edge"]
    tiles = min(MAX_TILES_PER_SIDE, max(1, math.isqrt(budget.pixels) // tile))
    side = max(tiles * tile, default) if budget.at_least_default else tiles * tile
    return {"size": {"longest_edge": side}}


def tiles(image_processor, budget) -> dict:
    side, default = image_processor.size["height"], image_processor.max_patches
    count = max(1, budget.pixels // (side * side))
    return {"max_patches": max(count, default) if budget.at_least_default else count}


def pixtral(image_processor, budget) -> dict:
    default = image_processor.size["longest_edge"]  # the vision tower's size: positions end there
    patch = image_processor.patch_size
    patch = patch if isinstance(patch, int) else patch["height"]
    return {"size": {"longest_edge": min(default, max(patch, math.isqrt(budget.pixels)))}}


def gemma3(image_processor, budget) -> dict:
    return {"do_pan_and_scan": True} if budget.at_least_default else {}


KNOBS: dict[str, tuple[str, Callable]] = {
    "qwen2_vl": ("pixels per picture", qwen), "qwen2_5_vl": ("pixels per picture", qwen),
    "qwen3_vl": ("pixels per picture", qwen), "idefics3": ("image splitting", idefics3),
    "smolvlm": ("image splitting", idefics3), "internvl": ("tiles per picture", tiles),
    "aya_vision": ("tiles per picture", tiles), "mistral3": ("longest edge", pixtral),
    "gemma3": ("pan and scan (high only)", gemma3),
}


def knob(model_type: str) -> Optional[str]:
    """What a budget changes for this family, or None when it reads every picture the same way."""
    return KNOBS[model_type][0] if model_type in KNOBS else None


def images_kwargs(model_type: str, image_processor, budget) -> dict:
    """The processor keyword arguments for `budget` (none for the default or a family without a knob)."""
    if budget is None or budget.pixels is None or model_type not in KNOBS:
        return {}
    return KNOBS[model_type][1](image_processor, budget)
