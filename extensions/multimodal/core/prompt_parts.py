"""Prompt parts: splitting a prompt at its image tags, and truncating encoded parts.

`split_prompt('text1<image1>text2<image2>text3', '<Img>', '</Img>')` gives five alternating parts:
`['text1<Img>', <image1>, '</Img>text2<Img>', <image2>, '</Img>text3']`. A split always starts and
ends with a text part (possibly empty) and never puts two images next to each other.
`truncate_parts` drops whole leading parts and whole images, never part of an image.
These functions know nothing about tokenizers, models or pixels: `prompt_encoding` attaches the ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from extensions.multimodal.core.image_codec import find_tags


@dataclass
class PromptPart:
    text: str  # the text with its markers, or the whole `<img>` tag for an image
    is_image: bool = False
    input_ids: Optional[torch.Tensor] = None  # (n,) int64
    embedding: Optional[torch.Tensor] = None  # (n, hidden)
    b64: Optional[str] = None  # an image's base64 data
    index: Optional[int] = None  # an image's 0-based position among the prompt's images
    layout: Optional[object] = None  # an image's ImageLayout (its ids, and what the model's route needs)
    features: Optional[torch.Tensor] = None  # an embedded image's feature rows (rows, hidden)
    picture: Optional[object] = None  # an image's decoded PIL picture, kept from laying it out, for embedding it
    # An image's identity for the caches: the SHA-256 of its base64 data (`Tag.digest`). A key holding
    # it, not the data, stays small however large the picture (a phone photo's tag holds megabytes).
    digest: Optional[bytes] = None


def n_tokens(part: PromptPart) -> int:
    """Length of an encoded part."""
    assert part.input_ids is not None, "encode the part before measuring it"
    return int(part.input_ids.shape[0])


def split_prompt(prompt: str, image_start: Optional[str], image_end: Optional[str]) -> List[PromptPart]:
    """Alternating text/image parts; `image_start` ends each text before an image, `image_end` begins each after."""
    start, end = image_start or "", image_end or ""
    parts: List[PromptPart] = []
    position = 0
    for index, tag in enumerate(find_tags(prompt)):
        text = prompt[position:tag.start]
        parts.append(PromptPart(text=(end if index > 0 else "") + text + start))
        parts.append(PromptPart(text=prompt[tag.start:tag.end], is_image=True, b64=tag.data, index=index,
                                digest=tag.digest))
        position = tag.end
    parts.append(PromptPart(text=(end if parts else "") + prompt[position:]))
    return parts


def count_images(parts: List[PromptPart]) -> int:
    return sum(1 for part in parts if part.is_image)


def truncate_parts(parts: List[PromptPart], max_length: int, start_marker_length: int) -> Tuple[List[PromptPart], int]:
    """Fit encoded `parts` into `max_length` tokens; returns (kept parts, number of images removed).

    Whole leading parts go first. When the first remaining part is text that must be cut and it
    ends with the image-start marker of the image right after it, the marker (its last
    `start_marker_length` tokens) is kept if it fits; otherwise that text and its image both go.
    """
    lengths = [n_tokens(part) for part in parts]
    rest = sum(lengths)
    first, removed = 0, 0
    # 1. whole leading parts, while what follows them is still too long
    while first < len(parts) - 1 and rest - lengths[first] > max_length:
        removed += parts[first].is_image
        rest -= lengths[first]
        first += 1
    kept = parts[first:]
    if rest <= max_length or not kept:
        return kept, removed
    # 2. the first part must shrink: an image goes whole, text keeps its last tokens
    head, after_head = kept[0], rest - lengths[first]
    if head.is_image:
        return kept[1:], removed + 1
    room = max_length - after_head
    if len(kept) > 1 and kept[1].is_image and start_marker_length > 0 and room < start_marker_length:
        return kept[2:], removed + 1
    head.input_ids = head.input_ids[n_tokens(head) - room:] if room > 0 else head.input_ids[:0]
    return kept, removed
