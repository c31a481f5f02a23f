"""Turning a prompt with image tags into the LLM's input ids and input embeddings.

`MultimodalEmbedder.forward(prompt, state, params)` returns `(prompt, input_ids, input_embeds,
n_images)`: ids `(n,)` int64 and embeddings `(n, hidden)`, in prompt order. Steps, each a method:
1. `_split_prompt`: alternating text/image parts, image start/end markers added to the text;
2. `_encode_text`: text through the host's `encode()` (BOS only on the first part), each image as
   its token count of `placeholder_token_id()` (`image_row_id()` when that is the pad id);
   truncation to `get_max_prompt_length(state)` drops whole leading parts and whole images (a
   notice in `state['notices']` says how many);
3. `_remove_old_images`: every image but the last gets `placeholder_embeddings()` (unless
   `add_all_images_to_prompt`); those images are never decoded;
4. `_embed`: text through `pipeline.embed_tokens` in one call; images that miss the embedding
   cache through `pipeline.embed_images` in one batch;
5. `torch.cat` of all parts.
It knows nothing about Gradio, chat history or how the model generates.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline, ImageLayout, feature_rows
from extensions.multimodal.defaults import with_defaults
from extensions.multimodal.embedding_cache import (BoundedLRU, image_cache_key, megabytes, pipeline_context,
                                                   tensor_nbytes)
from extensions.multimodal.image_codec import (DEFAULT_MAX_PIXELS, b64_to_bytes, decode_image_bytes,
                                               image_for_counting, image_label, tag_b64_to_image)
from extensions.multimodal.pipeline_loader import load_pipeline
from extensions.multimodal.prompt_parts import PromptPart, count_images, n_tokens, split_prompt, truncate_parts
from extensions.multimodal.loaded_model import model_device, pad_token_ids
from modules import shared
from modules.logging_colors import logger
from modules.text_generation import encode, get_max_prompt_length

__all__ = ["PromptPart", "MultimodalEmbedder", "EmbeddingCountError", "TooManyImagesError", "PromptTooLongError"]

TEXT_MEMO_BYTES = 8 * 1024 * 1024


class EmbeddingCountError(RuntimeError):
    """A pipeline returned a number of embedding rows that differs from the placeholder tokens."""


class TooManyImagesError(ValueError):
    """More images to embed than the pipeline or the `max_images_per_prompt` setting allows."""


class PromptTooLongError(ValueError):
    """Nothing of the prompt fits in `truncation_length - max_new_tokens`, even after dropping images."""


@dataclass
class EmbedStats:
    images: int = 0  # images given real embeddings
    from_cache: int = 0
    removed_images: int = 0  # dropped by truncation
    seconds: float = 0.0


class MultimodalEmbedder:
    def __init__(self, params: dict, pipeline: Optional[AbstractMultimodalPipeline] = None):
        """`params`: the extension's params. `pipeline`: use this one instead of `load_pipeline(params)`."""
        if pipeline is None:
            pipeline, _ = load_pipeline(params)
        self.pipeline = pipeline
        self.params = params
        self.cache = BoundedLRU(megabytes(with_defaults(params)["embedding_cache_mb"]))
        self.text_memo = BoundedLRU(TEXT_MEMO_BYTES)
        self.last_stats = EmbedStats()
        self._owner: tuple = (None, None)  # the (model, tokenizer) the caches were filled with
        self._warned_placeholder_rows = False
        self.last_route = None

    # -- 1. splitting -----------------------------------------------------------------------

    def _split_prompt(self, prompt: str, load_images: bool = False) -> List[PromptPart]:
        """Alternating text/image parts with markers; `load_images` also decodes every image."""
        rewrite = getattr(self.pipeline, "prompt_text", None)  # absent in pipelines of the original
        prompt = rewrite(prompt) if rewrite is not None else prompt
        parts = split_prompt(prompt, self.pipeline.image_start(), self.pipeline.image_end())
        if load_images:
            for part in parts:
                if part.is_image:
                    part.image = tag_b64_to_image(part.b64, self._max_pixels(), image_label(part.index))
        return parts

    # -- 2. token ids and truncation ----------------------------------------------------------

    def len_in_tokens(self, prompt: str) -> int:
        """The prompt's length in tokens, images included; decodes no image pixels."""
        self._reset_caches_if_model_changed()
        with torch.inference_mode():
            parts = self._assign_ids(self._split_prompt(prompt), add_bos=True)
        return sum(n_tokens(part) for part in parts)

    def _encode_text(self, state: dict, parts: List[PromptPart]) -> List[PromptPart]:
        """Ids for every part, then truncation to `get_max_prompt_length(state)` (never inside an image)."""
        parts = self._assign_ids(parts, add_bos=bool(state.get("add_bos_token", True)))
        max_length = get_max_prompt_length(state)
        total = sum(n_tokens(part) for part in parts)
        if max_length <= 0:
            raise PromptTooLongError(
                f"No room for the prompt: truncation_length ({state['truncation_length']}) - max_new_tokens "
                f"({state['max_new_tokens']}) = {max_length} tokens. Lower max_new_tokens.")
        start = self.pipeline.image_start() or ""
        marker_length = len(self._encode_memo(start, first=False)) if start else 0
        kept, removed = truncate_parts(parts, max_length, marker_length)
        if removed and self._several(kept) != self._several(parts):  # the last picture left lays out alone
            kept, more = truncate_parts(self._assign_ids(kept, bool(state.get("add_bos_token", True))), max_length,
                                        marker_length)
            removed += more
        if sum(n_tokens(part) for part in kept) == 0:
            raise PromptTooLongError(
                f"The prompt ({total} tokens, {count_images(parts)} image(s)) cannot fit in {max_length} tokens "
                f"(truncation_length - max_new_tokens) even after dropping images. Lower max_new_tokens.")
        self.last_stats.removed_images = removed
        if removed:
            self._notify_removed(state, removed, max_length)
        return kept

    def _assign_ids(self, parts: List[PromptPart], add_bos: bool) -> List[PromptPart]:
        embedded, several = self._images_to_embed(parts), self._several(parts)
        for i, part in enumerate(parts):
            if part.is_image:
                part.layout = self._image_layout(part, part.index in embedded, several)
                part.input_ids = part.layout.ids
            else:
                part.input_ids = self._encode_memo(part.text, first=i == 0, add_bos=add_bos)
        return parts

    def _images_to_embed(self, parts: List[PromptPart]) -> set:
        """Indices of the images that get real embeddings (the others get placeholder embeddings)."""
        indices = [part.index for part in parts if part.is_image]
        return set(indices if self.embeds_all_images() else indices[-1:])

    def embeds_all_images(self) -> bool:
        """`add_all_images_to_prompt`, or when that is unset (None) the pipeline's own choice."""
        setting = self.params.get("add_all_images_to_prompt")
        if setting is not None:
            return bool(setting)
        preferred = getattr(self.pipeline, "embeds_all_images", None)  # absent in pipelines of the original
        return bool(preferred and preferred())

    def _several(self, parts: List[PromptPart]) -> bool:
        """Whether the prompt's pictures are laid out as several (only pipelines that say it matters)."""
        depends = getattr(self.pipeline, "layout_depends_on_count", None)
        return bool(depends and depends()) and count_images(parts) > 1

    def _image_layout(self, part: PromptPart, embedded: bool, several: bool = False) -> ImageLayout:
        """The ids an image becomes: `num_image_embeds()` placeholders, or the pipeline's own per-image layout."""
        if not (embedded and self._varies_per_image()):
            return ImageLayout(self._placeholder_ids(int(self.pipeline.num_image_embeds())))
        if part.image is not None:
            return self._layout_of(part.image, several)
        key = ("image layout", part.b64, several)  # the prompt is measured many times per turn: lay out each image once
        layout = self.text_memo.get(key)
        if layout is None:
            # A count from the size needs only the header; a processor's own layout needs the pixels.
            read = tag_b64_to_image if self._overrides("image_layout") else image_for_counting
            layout = self._layout_of(read(part.b64, self._max_pixels(), image_label(part.index)), several)
            self.text_memo.put(key, layout, tensor_nbytes(layout.ids) + len(part.b64))
        return layout

    def _layout_of(self, image, several: bool = False) -> ImageLayout:
        if self._overrides("image_layout"):
            layout = self.pipeline.image_layout(image, several=True) if several else self.pipeline.image_layout(image)
            return ImageLayout(layout.ids.to(device=model_device(), dtype=torch.int64), layout.info)
        return ImageLayout(self._placeholder_ids(int(self.pipeline.num_image_embeds_for(image))))

    def _varies_per_image(self) -> bool:
        # Pipelines written for the original extension have neither method; ours inherit defaults that
        # only repeat num_image_embeds(). (Compared by name: tests reload modules.)
        return self._overrides("num_image_embeds_for") or self._overrides("image_layout")

    def _overrides(self, method_name: str) -> bool:
        method = getattr(type(self.pipeline), method_name, None)
        default = getattr(AbstractMultimodalPipeline, method_name)
        return method is not None and method.__qualname__ != default.__qualname__

    def _placeholder_ids(self, count: int) -> torch.Tensor:
        return torch.full((count,), int(self.pipeline.placeholder_token_id()), dtype=torch.int64,
                          device=model_device())

    def image_row_id(self) -> int:
        """The id standing in `input_ids` for an image row: the pipeline's placeholder, unless a host
        could take it for padding. text-generation-webui calls `generate(inputs=ids, inputs_embeds=...)`
        without an attention mask, so transformers masks every position whose id is the pad id: with
        LLaVA-1.5's placeholder `<unk>` = 0 = Vicuna's pad id the image would silently vanish."""
        placeholder = int(self.pipeline.placeholder_token_id())
        pads = pad_token_ids()
        if placeholder not in pads:
            return placeholder
        tokenizer = shared.tokenizer
        candidates = [getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "bos_token_id", None)]
        candidates += range(int(shared.model.get_input_embeddings().num_embeddings))
        eos = getattr(tokenizer, "eos_token_id", None)  # a prompt full of EOS would skew repetition penalties
        return next(int(i) for i in candidates if isinstance(i, int) and i not in pads and i != eos)

    def _encode_memo(self, text: str, first: bool, add_bos: bool = False) -> torch.Tensor:
        """The ids of one text part, memoised: a chat prompt is measured many times per turn.

        The first part is encoded as the host encodes a whole prompt (`add_bos` is the state's
        `add_bos_token`); later parts as they follow an image's last special token in the whole
        prompt (`encode_after_special`), so no host puts a BOS in the middle of the prompt (today's
        text-generation-webui keeps a tokenizer's BOS even when told `add_bos_token=False`).
        """
        key = (text, first, add_bos)
        ids = self.text_memo.get(key)
        if ids is None:
            if first:
                ids = encode(text, add_bos_token=add_bos)[0].to(dtype=torch.int64)
            else:
                ids = encode_after_special(text)
            self.text_memo.put(key, ids, tensor_nbytes(ids) + 4 * len(text))
        return ids

    def _notify_removed(self, state: dict, removed: int, max_length: int) -> None:
        message = (f"Removed {removed} image(s) from the start of the prompt: it did not fit in {max_length} tokens "
                   f"(truncation_length - max_new_tokens). Lower max_new_tokens or start a new chat to keep them.")
        logger.warning(f"Multimodal: {message}")
        state.setdefault("notices", []).append(message)

    # -- 3. older images ------------------------------------------------------------------------

    def _remove_old_images(self, parts: List[PromptPart], params: dict) -> List[PromptPart]:
        """Every image but the last gets placeholder embeddings, unless every image is embedded."""
        if self.embeds_all_images():
            return parts
        older = [part for part in parts if part.is_image][:-1]
        if not older:
            return parts
        with torch.inference_mode():
            rows = self._placeholder_rows()
        for part in older:
            if part.input_ids is not None and n_tokens(part) != rows.shape[0]:
                self._warn_placeholder_rows(n_tokens(part), rows.shape[0])
                part.input_ids = self._placeholder_ids(rows.shape[0])
            part.embedding = rows
        return parts

    def _placeholder_rows(self) -> torch.Tensor:
        rows = self.pipeline.placeholder_embeddings()
        return rows[0] if rows.dim() == 3 and rows.shape[0] == 1 else rows  # (rows, hidden)

    def _warn_placeholder_rows(self, expected: int, got: int) -> None:
        # MiniGPT-4 and InstructBLIP modules return fewer rows than num_image_embeds(): follow the rows.
        if not self._warned_placeholder_rows:
            self._warned_placeholder_rows = True
            logger.warning(f"Multimodal: pipeline '{self.pipeline.name()}' returns {got} placeholder embedding rows "
                           f"for an image counted as {expected} tokens; using {got} placeholder ids for older images.")

    def _check_image_limit(self, parts: List[PromptPart], params: dict) -> None:
        to_embed = sum(1 for part in parts if part.is_image and part.embedding is None)
        limits = [(params.get("max_images_per_prompt"), "the multimodal-max_images_per_prompt setting")]
        if hasattr(self.pipeline, "max_images_per_prompt"):
            limits.append((self.pipeline.max_images_per_prompt(), f"the pipeline '{self.pipeline.name()}'"))
        for limit, source in limits:
            if limit is not None and to_embed > int(limit):
                raise TooManyImagesError(
                    f"The prompt has {to_embed} images to embed, but {source} allows at most {int(limit)} per prompt. "
                    f"Send fewer images, or turn off add_all_images_to_prompt so only the last image is embedded.")

    # -- 4. embedding -----------------------------------------------------------------------------

    def _embed(self, parts: List[PromptPart]) -> List[PromptPart]:
        """Embeddings for every part that has none yet: images in one batch, text in one call.

        An image whose ids hold more than placeholders (markers, row breaks, tile tokens) gets the token
        embeddings of its ids with its feature rows at the placeholder positions.
        """
        with torch.inference_mode():
            self._embed_images([part for part in parts if part.is_image and part.embedding is None], self._several(parts))
            mixed = [part for part in parts if part.is_image and not bool(self._feature_rows(part).all())]
            token_rows = self._embed_tokens([part for part in parts if not part.is_image] + mixed)
            for part in parts:
                if not part.is_image:
                    part.embedding = token_rows[id(part)]
            for part in mixed:
                rows = token_rows[id(part)].clone()
                rows[self._feature_rows(part)] = feature_rows(part.features).to(rows.device, rows.dtype)
                part.embedding = rows
        return parts

    def _embed_tokens(self, parts: List[PromptPart]) -> Dict[int, torch.Tensor]:
        """`pipeline.embed_tokens` on the ids of `parts` in one call; `(n_tokens, hidden)` per part, by id(part)."""
        if not parts:
            return {}
        rows = self.pipeline.embed_tokens(torch.cat([part.input_ids for part in parts]))
        rows = rows[0] if rows.dim() == 3 and rows.shape[0] == 1 else rows  # (tokens, hidden)
        return {id(part): embedding for part, embedding in zip(parts, torch.split(rows, [n_tokens(p) for p in parts]))}

    def _feature_rows(self, part: PromptPart) -> torch.Tensor:
        """`(n,)` bool: the positions of an image part that take feature rows."""
        return part.input_ids == int(self.pipeline.placeholder_token_id())

    def _embed_images(self, parts: List[PromptPart], several: bool = False) -> None:
        self.last_stats.images = len(parts)
        if not parts:
            self.last_stats.from_cache = 0
            return
        context = pipeline_context(self.pipeline, self.params) + ("|one of several" if several else "")
        keys = [image_cache_key(self._image_bytes(part), context) for part in parts]
        found: Dict[str, torch.Tensor] = {}
        for key in dict.fromkeys(keys):
            cached = self.cache.get(key)
            if cached is not None:
                found[key] = cached
        self.last_stats.from_cache = sum(1 for key in keys if key in found)
        misses = {key: part for key, part in zip(keys, parts) if key not in found}  # one per distinct image
        if misses:
            found.update(self._embed_misses(misses, several))
        for key, part in zip(keys, parts):
            part.features, part.embedding = found[key], feature_rows(found[key])

    def _embed_misses(self, misses: Dict[str, PromptPart], several: bool = False) -> Dict[str, torch.Tensor]:
        parts = list(misses.values())
        images = [part.image if part.image is not None else
                  decode_image_bytes(self._image_bytes(part), self._max_pixels(), image_label(part.index))
                  for part in parts]
        output = self.pipeline.embed_images(images, several=True) if several else self.pipeline.embed_images(images)
        rows = split_image_rows(output, [int(self._feature_rows(part).sum()) for part in parts], self.pipeline.name())
        fresh = {}
        for key, embedding in zip(misses, rows):
            fresh[key] = embedding
            self.cache.put(key, embedding, tensor_nbytes(embedding))
        return fresh

    def _image_bytes(self, part: PromptPart) -> bytes:
        return b64_to_bytes(part.b64, image_label(part.index))

    # -- 5. forward -----------------------------------------------------------------------------

    def forward(self, prompt: str, state: dict, params: dict):
        """`(prompt, input_ids (n,), input_embeds (n, hidden), number of images kept in the prompt)`.

        Image rows carry `image_row_id()` in the ids returned. How the model takes them, when it needs more
        than the embeddings (`pipeline.generate_kwargs`), is left in `self.last_route` (else None).
        """
        started = time.perf_counter()
        self.params = params
        self.last_stats = EmbedStats()
        self._reset_caches_if_model_changed()
        with torch.inference_mode():
            parts = self._encode_text(state, self._split_prompt(prompt))
            parts = self._remove_old_images(parts, params)
            self._check_image_limit(parts, params)
            parts = self._embed(parts)
            input_ids, input_embeds = stitch(parts, self.pipeline.name())
            self.last_route = self._route(parts, input_ids, input_embeds)
            input_ids = self._unmaskable(parts, input_ids)
        self.last_stats.seconds = time.perf_counter() - started
        return prompt, input_ids, input_embeds, count_images(parts)

    def _route(self, parts: List[PromptPart], input_ids: torch.Tensor, input_embeds: torch.Tensor):
        if not self._overrides("generate_kwargs"):
            return None
        images = [part for part in parts if part.is_image]
        return self.pipeline.generate_kwargs(input_ids[None], input_embeds[None], [part.layout for part in images],
                                             [part.features for part in images])

    def _unmaskable(self, parts: List[PromptPart], input_ids: torch.Tensor) -> torch.Tensor:
        """`input_ids` with every image row set to `image_row_id()` (the placeholder, unless it is a pad id)."""
        row_id = self.image_row_id()
        if row_id == int(self.pipeline.placeholder_token_id()):
            return input_ids
        mask = torch.cat([self._feature_rows(part) if part.is_image else torch.zeros_like(part.input_ids, dtype=torch.bool)
                          for part in parts]).to(input_ids.device)
        return torch.where(mask, torch.full_like(input_ids, row_id), input_ids)

    def _max_pixels(self) -> int:
        return int(self.params.get("max_image_pixels") or DEFAULT_MAX_PIXELS)

    def _reset_caches_if_model_changed(self) -> None:
        owner = (shared.model, shared.tokenizer)
        if owner[0] is not self._owner[0] or owner[1] is not self._owner[1]:
            self.cache.clear()
            self.text_memo.clear()
            self._owner = owner


def encode_after_special(text: str) -> torch.Tensor:
    """`text`'s ids where it follows a special token, as in a whole prompt after an image's tokens.

    Encoded alone, a tokenizer whose pre-tokenizer prepends "▁" to the start of the text
    (SentencePiece-style Metaspace, Llama's) writes one there that the whole prompt does not have,
    since the text does not start the prompt. Encoding it after a special token (the EOS: split off
    before pre-tokenization) and dropping that token's ids gives the whole prompt's ids.
    """
    anchor = getattr(shared.tokenizer, "eos_token", None)
    if not anchor:
        return strip_leading_bos(encode(text, add_special_tokens=False, add_bos_token=False)[0].to(torch.int64))
    anchor_ids = encode(anchor, add_special_tokens=False, add_bos_token=False)[0]
    ids = encode(anchor + text, add_special_tokens=False, add_bos_token=False)[0]
    assert torch.equal(ids[:len(anchor_ids)], anchor_ids), "the EOS token is not split off the text"
    return ids[len(anchor_ids):].to(torch.int64)


def strip_leading_bos(ids: torch.Tensor) -> torch.Tensor:
    bos = getattr(shared.tokenizer, "bos_token_id", None)
    while bos is not None and ids.shape[0] > 0 and int(ids[0]) == bos:
        ids = ids[1:]
    return ids


def split_image_rows(output, counts: Sequence[int], pipeline_name: str) -> List[torch.Tensor]:
    """`embed_images`' result -> one `(tokens, hidden)` tensor per image, checked against `counts`.

    Accepted: a `(num_images, tokens, hidden)` tensor, a `(total tokens, hidden)` tensor, or a
    list with one `(tokens, hidden)` tensor per image.
    """
    if isinstance(output, torch.Tensor) and output.dim() == 2:
        if output.shape[0] != sum(counts):
            raise count_error(pipeline_name, output.shape[0], counts)
        return list(torch.split(output, list(counts)))
    per_image = list(output) if isinstance(output, (list, tuple)) or output.dim() == 3 else None
    if per_image is None or len(per_image) != len(counts):
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else f"{len(per_image or [])} items"
        raise EmbeddingCountError(f"Pipeline '{pipeline_name}' returned image embeddings of shape {shape} for "
                                  f"{len(counts)} image(s); expected (images, tokens, hidden) or one tensor per image.")
    rows = sum(int(embedding.shape[0]) for embedding in per_image)
    if any(int(embedding.shape[0]) != count for embedding, count in zip(per_image, counts)):
        raise count_error(pipeline_name, rows, counts)
    return per_image


def count_error(pipeline_name: str, rows: int, counts: Sequence[int]) -> EmbeddingCountError:
    return EmbeddingCountError(
        f"Image features and image tokens do not match for pipeline '{pipeline_name}': embed_images() returned "
        f"{rows} embedding rows for {len(counts)} image(s), but the prompt holds {sum(counts)} placeholder tokens "
        f"for them ({', '.join(map(str, counts))} per image, from num_image_embeds()). The pipeline's "
        f"num_image_embeds() and embed_images() disagree: check that it matches the model's vision tower.")


def stitch(parts: List[PromptPart], pipeline_name: str):
    """`torch.cat` of the parts' ids `(n,)` and embeddings `(n, hidden)`, on the text's device and dtype."""
    reference = next((part.embedding for part in parts if not part.is_image), parts[0].embedding)
    hidden = reference.shape[-1]
    for part in parts:
        if part.embedding.shape[-1] != hidden:
            raise EmbeddingCountError(f"Pipeline '{pipeline_name}' gives {part.embedding.shape[-1]}-wide embeddings "
                                      f"for {'an image' if part.is_image else 'text'}, but the text embeddings are "
                                      f"{hidden}-wide: the pipeline's projector does not match the model.")
    embeds = torch.cat([part.embedding.to(reference.device, reference.dtype) for part in parts])
    ids = torch.cat([part.input_ids.to(reference.device) for part in parts])
    assert ids.shape[0] == embeds.shape[0], (ids.shape, embeds.shape)
    return ids, embeds
