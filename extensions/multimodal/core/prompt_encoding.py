"""A prompt with image tags -> its parts with token ids, truncated by whole images. No pixels are embedded.

`PromptEncoder.encode(prompt, state)`:
1. `split`: alternating text/image parts, the pipeline's image start/end markers added to the text;
2. ids: text through the host's `encode()` (the state's BOS rule on the first part only), each
   image as its layout's ids: the pipeline's own per-image layout for an image that is embedded,
   else `num_image_embeds()` placeholder ids;
3. truncation to `get_max_prompt_length(state)`, dropping whole leading parts and whole images (the
   user is told how many).
`measure(prompt)` is the length in tokens, images included; it decodes a picture only when the
pipeline needs the pixels to lay it out. Ids and layouts are memoised: a chat prompt is measured
many times per turn. A picture decoded to be laid out is kept, with what the pipeline prepared from it
(`ImageLayout.prepared`: its processor's tensors), for embedding it (`PromptPart.picture`,
`part.layout.prepared`): a new picture is decoded and processed once, not again when it is embedded.
That store is bounded in bytes, as the embedding cache is (`embedding_cache_mb`).
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import List, Optional, Tuple

import torch
from PIL import Image

from extensions.multimodal.core import dropped_pictures, notices
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline, ImageLayout, overrides
from extensions.multimodal.core.defaults import DROPPED_IMAGES, max_image_pixels, wants_bos, with_defaults
from extensions.multimodal.core.bounded_lru import BoundedLRU
from extensions.multimodal.core.embedding_cache import megabytes, nbytes_of, tensor_nbytes
from extensions.multimodal.core.image_budget import Budget
from extensions.multimodal.core.image_codec import image_for_counting, image_label, tag_b64_to_image
from extensions.multimodal.core.loaded_model import model_device, tokenizer
from extensions.multimodal.core.prompt_parts import PromptPart, count_images, n_tokens, split_prompt, truncate_parts
from modules.text_generation import encode, get_max_prompt_length

MEMO_BYTES = 8 * 1024 * 1024


class PromptTooLongError(ValueError):
    """Nothing of the prompt fits in `truncation_length - max_new_tokens`, even after dropping images."""


class PromptEncoder:
    def __init__(self, pipeline, params: dict):
        self.pipeline = pipeline
        self.params = params
        self.memo = BoundedLRU(MEMO_BYTES)
        # per layout key: (the decoded picture, what the pipeline prepared from it), kept for embedding it
        self.laid_out = BoundedLRU(megabytes(with_defaults(params)["embedding_cache_mb"]))
        self._last_split: Optional[Tuple[str, List[PromptPart]]] = None  # (prompt, its parts as split)

    def split(self, prompt: str) -> List[PromptPart]:
        """The prompt's parts, a fresh copy for each call (the caller lays them out in place). The last
        prompt's split is kept: a chat turn measures its prompt, then encodes the same string, and with
        phone photos in the history finding and slicing their tags takes milliseconds a time. Keeping
        it holds that one prompt until the next one comes."""
        last = self._last_split
        if last is None or last[0] is not prompt:
            parts = split_prompt(self.pipeline.prompt_text(prompt), self.pipeline.image_start(),
                                 self.pipeline.image_end())
            last = self._last_split = (prompt, parts)
        return [copy.copy(part) for part in last[1]]

    def measure(self, prompt: str, budget: Optional[Budget] = None) -> int:
        with torch.inference_mode():
            parts = self.assign_ids(self.split(prompt), wants_bos({}), budget)
        return sum(n_tokens(part) for part in parts)

    def encode(self, prompt: str, state: dict, budget: Optional[Budget] = None) -> Tuple[List[PromptPart], int]:
        """(the parts that fit, with ids; how many images were dropped to fit). `budget`: what each
        picture may cost, for pipelines that take one (None: the checkpoint's settings)."""
        add_bos = wants_bos(state)
        parts = self.assign_ids(self.split(prompt), add_bos, budget)
        max_length = get_max_prompt_length(state)
        if max_length <= 0:
            raise PromptTooLongError(
                f"No room for the prompt: truncation_length ({state['truncation_length']}) - max_new_tokens "
                f"({state['max_new_tokens']}) = {max_length} tokens. Lower max_new_tokens.")
        kept, removed = truncate_parts(parts, max_length, self.start_marker_length())
        if removed and self.several(kept) != self.several(parts):  # the last picture left lays out alone
            kept, more = truncate_parts(self.assign_ids(kept, add_bos, budget), max_length, self.start_marker_length())
            removed += more
        if sum(n_tokens(part) for part in kept) == 0:
            raise PromptTooLongError(
                f"The prompt ({sum(n_tokens(part) for part in parts)} tokens, {count_images(parts)} image(s)) cannot "
                f"fit in {max_length} tokens (truncation_length - max_new_tokens) even after dropping images. "
                f"Lower max_new_tokens.")
        if removed:
            tell_dropped(state, [part for part in parts if part.is_image and not any(part is k for k in kept)],
                         max_length)
        return kept, removed

    def start_marker_length(self) -> int:
        start = self.pipeline.image_start() or ""
        return len(self.text_ids(start, first=False)) if start else 0

    def assign_ids(self, parts: List[PromptPart], add_bos: bool, budget: Optional[Budget] = None) -> List[PromptPart]:
        embedded, several = self.images_to_embed(parts), self.several(parts)
        for i, part in enumerate(parts):
            if part.is_image:
                part.layout, part.picture = self.image_layout(part, part.index in embedded, several, budget)
                part.input_ids = part.layout.ids
            else:
                part.input_ids = self.text_ids(part.text, first=i == 0, add_bos=add_bos)
        return parts

    def images_to_embed(self, parts: List[PromptPart]) -> set:
        """Indices of the images that get real embeddings (the others get placeholder embeddings)."""
        indices = [part.index for part in parts if part.is_image]
        return set(indices if embeds_all_images(self.params, self.pipeline) else indices[-1:])

    def several(self, parts: List[PromptPart]) -> bool:
        """Whether the prompt's pictures are laid out as several (only pipelines that say it matters)."""
        return self.pipeline.layout_depends_on_count() and count_images(parts) > 1

    def image_layout(self, part: PromptPart, embedded: bool, several: bool = False,
                     budget: Optional[Budget] = None) -> Tuple[ImageLayout, Optional[Image.Image]]:
        """The ids an image becomes: `num_image_embeds()` placeholders, or the pipeline's own per-image layout
        (with what it prepared, when kept); and the picture, when it was decoded for that and kept."""
        pixels = overrides(self.pipeline, "image_layout")  # a processor's own layout needs the pixels
        if not (embedded and (pixels or overrides(self.pipeline, "num_image_embeds_for"))):
            return ImageLayout(self.placeholder_ids(int(self.pipeline.num_image_embeds()))), None
        budget = budget if takes_budget(self.pipeline) else None
        key = ("image layout", part.digest, several, budget)
        layout = self.memo.get(key)
        if layout is not None:
            picture, prepared = self.laid_out.get(key) or (None, None)
            return replace(layout, prepared=prepared), picture
        read = tag_b64_to_image if pixels else image_for_counting  # a count from the size needs the header only
        image = read(part.b64, max_image_pixels(self.params), image_label(part.index))
        if not pixels:
            layout = ImageLayout(self.placeholder_ids(int(self.pipeline.num_image_embeds_for(image))))
            self.memo.put(key, layout, tensor_nbytes(layout.ids))
            return layout, None
        layout = self.layout_of(image, several, budget)
        self.memo.put(key, replace(layout, prepared=None), tensor_nbytes(layout.ids))
        self.laid_out.put(key, (image, layout.prepared), picture_nbytes(image) + nbytes_of(layout.prepared))
        return layout, image

    def layout_of(self, image, several: bool, budget: Optional[Budget]) -> ImageLayout:
        kwargs = ({"several": True} if several else {}) | ({"budget": budget} if budget is not None else {})
        layout = self.pipeline.image_layout(image, **kwargs)
        return replace(layout, ids=layout.ids.to(device=model_device(), dtype=torch.int64))

    def placeholder_ids(self, count: int) -> torch.Tensor:
        return torch.full((count,), int(self.pipeline.placeholder_token_id()), dtype=torch.int64,
                          device=model_device())

    def text_ids(self, text: str, first: bool, add_bos: bool = False) -> torch.Tensor:
        """The ids of one text part, memoised.

        The first part is encoded as the host encodes a whole prompt (`add_bos` is the state's
        `add_bos_token`); later parts as they follow an image's last special token in the whole
        prompt (`encode_after_special`), so no host puts a BOS in the middle of the prompt (today's
        text-generation-webui keeps a tokenizer's BOS even when told `add_bos_token=False`).
        """
        key = (text, first, add_bos)
        ids = self.memo.get(key)
        if ids is None:
            ids = encode(text, add_bos_token=add_bos)[0].to(dtype=torch.int64) if first else encode_after_special(text)
            self.memo.put(key, ids, tensor_nbytes(ids) + 4 * len(text))
        return ids


def picture_nbytes(image: Image.Image) -> int:
    return image.width * image.height * len(image.getbands())


def takes_budget(pipeline) -> bool:
    """Whether the pipeline lays out and embeds pictures by a budget (`budget_knob`)."""
    return pipeline.budget_knob() is not None


def tell_dropped(state: dict, dropped: List[PromptPart], max_length: int) -> None:
    """The user learns which pictures were left out; `state[DROPPED_IMAGES]` says it for hosts to show."""
    located = dropped_pictures.locate([part.b64 for part in dropped], state)
    state.setdefault(DROPPED_IMAGES, []).extend(located)
    notices.tell(state, f"Removed {len(dropped)} image(s) from the start of the prompt: "
                        f"{dropped_pictures.describe(located)} {'was' if len(dropped) == 1 else 'were'} left out "
                        f"to fit the context ({max_length} tokens: truncation_length - max_new_tokens). Lower "
                        f"max_new_tokens or start a new chat to keep them.")


def embeds_all_images(params: dict, pipeline: Optional[AbstractMultimodalPipeline]) -> bool:
    """`add_all_images_to_prompt`, or when that is unset (None) the pipeline's own choice (no pipeline yet: False)."""
    setting = params.get("add_all_images_to_prompt")
    if setting is not None:
        return bool(setting)
    return pipeline is not None and pipeline.embeds_all_images()


def encode_after_special(text: str) -> torch.Tensor:
    """`text`'s ids where it follows a special token, as in a whole prompt after an image's tokens.

    Encoded alone, a tokenizer whose pre-tokenizer prepends "▁" to the start of the text
    (SentencePiece-style Metaspace, Llama's) writes one there that the whole prompt does not have,
    since the text does not start the prompt. Encoding it after a special token (the EOS: split off
    before pre-tokenization) and dropping that token's ids gives the whole prompt's ids.
    """
    anchor = getattr(tokenizer(), "eos_token", None)
    if not anchor:
        return strip_leading_bos(encode(text, add_special_tokens=False, add_bos_token=False)[0].to(torch.int64))
    anchor_ids = encode(anchor, add_special_tokens=False, add_bos_token=False)[0]
    ids = encode(anchor + text, add_special_tokens=False, add_bos_token=False)[0]
    assert torch.equal(ids[:len(anchor_ids)], anchor_ids), "the EOS token is not split off the text"
    return ids[len(anchor_ids):].to(torch.int64)


def strip_leading_bos(ids: torch.Tensor) -> torch.Tensor:
    bos = getattr(tokenizer(), "bos_token_id", None)
    while bos is not None and ids.shape[0] > 0 and int(ids[0]) == bos:
        ids = ids[1:]
    return ids
