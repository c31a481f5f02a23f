"""The ids an image becomes in a prompt, as the checkpoint's own processor writes them.

In: a transformers processor (`loaded_model.processor()`, loaded by `processor_loading.load_processor`)
and PIL images. Out: per image, the ids its placeholder expands to: start/end markers, row breaks,
tile tokens and the repeated image token, everything the processor writes for it. Nothing here resizes or counts by hand: the
processor is run on placeholder text and its own replacement text is tokenized.

Tokens per image vary with the image in most families (Qwen's dynamic resolution, Pixtral's rows,
Idefics3/SmolVLM splitting, InternVL/Aya tiles, LLaVA-NeXT/OneVision anyres). Images go to the
processor as a flat list (each laid out on its own), or `together`, as one conversation's list,
the way `apply_chat_template(tokenize=True)` passes a conversation's pictures: LLaVA-OneVision then
lays out each of several pictures as its base tile and a newline, no anyres tiles.

Text the processor writes around an image's special tokens (Gemma 3: "\\n\\n" on each side) is
kept apart as `before` / `after`: tokenized on its own it can split differently from the
processor's whole-prompt tokenization (a tokenizer with newline-run tokens merges the template's
"\\n" with it), so it belongs to the neighbouring text parts, encoded with them.

This module knows nothing about the model's weights and nothing about the host.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from PIL import Image
from transformers.feature_extraction_utils import BatchFeature


@dataclass(frozen=True)
class ImageTokens:
    """One image's share of the prompt: `before` + ids + `after`, in that order."""
    before: str  # plain text the processor writes before the image's first special token (usually "")
    ids: torch.Tensor  # (n,) int64: from the image's first special token to its last
    after: str  # plain text after the image's last special token (usually "")


@dataclass
class ProcessedImages:
    """The processor's output for the images of one prompt."""
    inputs: BatchFeature  # the tensors the vision tower takes (pixel_values, image_grid_thw, image_sizes, ...)
    tokens: list[ImageTokens]  # one per image, in order


def image_placeholder(processor) -> str:
    """The text that stands for one image in the processor's input (what its chat template writes).

    E.g. "<image>", "<|image_pad|>" (Qwen; the template wraps it in vision start/end), "[IMG]"
    (Pixtral), "<start_of_image>" (Gemma 3), "<IMG_CONTEXT>" (InternVL), "<|image|>" (Mllama).
    """
    token = getattr(processor, "image_token", None)
    if not token:
        raise ValueError(f"{type(processor).__name__} names no image_token; is this an image-text processor?")
    return token


def image_token_id(model) -> int:
    """The id whose rows the model replaces by image features (`config.image_token_id`)."""
    config = model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(model).__name__}'s config has no image_token_id / image_token_index")


def process_images(processor, images: Sequence[Image.Image], together: bool = False,
                   images_kwargs: Optional[dict] = None) -> ProcessedImages:
    """Run the processor once on the images of one prompt; their tensors and their ids.

    Images go in as given (the processor converts modes itself), one placeholder each; `together`:
    as one conversation's pictures (see the module docstring); `images_kwargs`: the image
    processor's per-call settings (a budget: `budget_kwargs`).
    """
    if not images:
        raise ValueError("process_images needs at least one image, got 0")
    images = list(images)
    text = image_placeholder(processor) * len(images)
    inputs = processor(text=[text], images=[images] if together else images, return_tensors="pt",
                       add_special_tokens=False, return_text_replacement_offsets=True, **(images_kwargs or {}))
    replacements = inputs.pop("text_replacement_offsets", None)
    pattern = added_tokens_pattern(processor.tokenizer)
    if replacements is None:  # the processor keeps its placeholder as is (Mllama: one <|image|> per image)
        tokens = [split_replacement(processor.tokenizer, image_placeholder(processor), pattern)] * len(images)
    else:
        strings = [entry["replacement"] for entry in replacements[0] if entry["type"] == "image"]
        tokens = [split_replacement(processor.tokenizer, string, pattern) for string in strings]
    joined = torch.cat([t.ids for t in tokens])
    if (replacements is not None and not any(t.before or t.after for t in tokens)
            and not torch.equal(joined, inputs["input_ids"][0])):
        raise AssertionError(f"{type(processor).__name__}: image ids tokenized one by one differ from the "
                             f"processor's own ({joined.numel()} vs {inputs['input_ids'].shape[-1]} ids)")
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"):
        inputs.pop(key, None)
    return ProcessedImages(inputs=inputs, tokens=tokens)


def split_replacement(tokenizer, replacement: str, pattern: re.Pattern | None = None) -> ImageTokens:
    """`replacement` as plain text before its first added token, ids up to its last, plain text after."""
    pattern = pattern or added_tokens_pattern(tokenizer)
    spans = [m.span() for m in pattern.finditer(replacement)]
    if not spans:
        raise ValueError(f"the image replacement text {replacement[:60]!r} holds no special token of the tokenizer")
    start, end = spans[0][0], spans[-1][1]
    ids = tokenizer(replacement[start:end], add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return ImageTokens(before=replacement[:start], ids=ids, after=replacement[end:])


# Per live tokenizer: (its length when built, its added-tokens pattern). Building the pattern sorts
# every added token, which costs ~0.25 s per image for a tokenizer with 30k added words.
_patterns: "weakref.WeakKeyDictionary[object, tuple[int, re.Pattern]]" = weakref.WeakKeyDictionary()


def added_tokens_pattern(tokenizer) -> re.Pattern:
    """Matches any added token (the tokenizer splits text at these before running its model)."""
    kept = _patterns.get(tokenizer)
    if kept is not None and kept[0] == len(tokenizer):
        return kept[1]
    tokens = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(token) for token in tokens))
    _patterns[tokenizer] = (len(tokenizer), pattern)
    return pattern
