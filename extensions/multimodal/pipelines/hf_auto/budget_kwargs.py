"""A picture budget (`image_budget.Budget`) as the family's own processor keyword arguments.

They go into every processor call for the prompt's pictures (`images_kwargs`), so a picture laid out
and embedded under a budget is what Hugging Face's `processor(text, images, **kwargs)` gives with the
same arguments. Only knobs a processor honours per call are used (measured on transformers 5.23 and
5.6: the token count follows them and `generate` runs):
- Qwen2-VL, Qwen2.5-VL, Qwen3-VL: `size` {shortest_edge, longest_edge}: the pixel range per picture;
- Idefics3, SmolVLM: `size` {longest_edge}: a multiple of the tile side, at most 6 tiles a side;
- InternVL, Aya Vision: `max_patches`: tiles per picture;
- Mistral 3: `size` {longest_edge}, never above the vision tower's size.
LLaVA, LLaVA-NeXT, LLaVA-OneVision and Mllama take none per call (their grid and tiles are read
from the processor's own attributes, not from the call), nor does Gemma 3 here: its one knob, pan
and scan, also writes text around the picture ("Here is the original image ..."), which the prompt's
text parts, split at the checkpoint's own image markers, would not follow. These families read every
picture the same way.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

MAX_TILES_PER_SIDE = 6  # Idefics3's row/column tokens go up to 6


def within_default(value: int, default: int, budget) -> int:
    """A knob's value for the budget, kept at or above the default for "high", at or below it for "low"."""
    if budget.at_least_default:
        return max(value, default)
    return min(value, default) if budget.at_most_default else value


def qwen(image_processor, budget) -> dict:
    low, high = image_processor.size["shortest_edge"], image_processor.size["longest_edge"]
    cap = within_default(budget.pixels, high, budget)
    return {"size": {"shortest_edge": min(low, cap), "longest_edge": cap}}


def idefics3(image_processor, budget) -> dict:
    tile, default = image_processor.max_image_size["longest_edge"], image_processor.size["longest_edge"]
    tiles = min(MAX_TILES_PER_SIDE, max(1, math.isqrt(budget.pixels) // tile))
    return {"size": {"longest_edge": within_default(tiles * tile, default, budget)}}


def tiles(image_processor, budget) -> dict:
    side, default = image_processor.size["height"], image_processor.max_patches
    return {"max_patches": within_default(max(1, budget.pixels // (side * side)), default, budget)}


def pixtral(image_processor, budget) -> dict:
    default = image_processor.size["longest_edge"]  # the vision tower's size: positions end there
    patch = image_processor.patch_size
    patch = patch if isinstance(patch, int) else patch["height"]
    return {"size": {"longest_edge": min(default, max(patch, math.isqrt(budget.pixels)))}}


KNOBS: dict[str, tuple[str, Callable]] = {
    "qwen2_vl": ("pixels per picture", qwen), "qwen2_5_vl": ("pixels per picture", qwen),
    "qwen3_vl": ("pixels per picture", qwen), "idefics3": ("image splitting", idefics3),
    "smolvlm": ("image splitting", idefics3), "internvl": ("tiles per picture", tiles),
    "aya_vision": ("tiles per picture", tiles), "mistral3": ("longest edge", pixtral),
}


def knob(model_type: str) -> Optional[str]:
    """What a budget changes for this family, or None when it reads every picture the same way."""
    return KNOBS[model_type][0] if model_type in KNOBS else None


def images_kwargs(model_type: str, image_processor, budget) -> dict:
    """The processor keyword arguments for `budget` (none for the default or a family without a knob)."""
    if budget is None or budget.pixels is None or model_type not in KNOBS:
        return {}
    return KNOBS[model_type][1](image_processor, budget)
