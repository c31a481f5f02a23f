"""A prompt with image tags -> the language model's input ids, input embeddings and route.

`MultimodalEmbedder(params).forward(prompt, state)` returns an `Embedded`. It chooses which images get
real embeddings and puts the pieces together; each step lives in its own module:
1. `prompt_encoding`: parts and ids, truncated by whole images;
2. every image but the last gets `placeholder_embeddings()` (unless every image is embedded:
   `add_all_images_to_prompt`, or the pipeline's choice); those are never decoded;
3. `image_embedding`: the other images' rows, through the content cache; text through
   `pipeline.embed_tokens` in one call;
4. `stitch`: `torch.cat` of all parts; then the pipeline's route, when the model needs more than
   the embeddings (`generate_kwargs`), and ids a host cannot mistake for padding (`pad_safe_ids`).
It knows nothing about Gradio or chat history. The result is returned, never kept on the embedder:
requests on several threads share it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from extensions.multimodal.core import image_budget, loaded_model
from extensions.multimodal.abstract_pipeline import feature_rows, overrides
from extensions.multimodal.core.image_embedding import EmbeddingCountError, ImageEmbedder, feature_positions
from extensions.multimodal.core.pad_safe_ids import unmaskable
from extensions.multimodal.core.pipeline_loader import load_pipeline
from extensions.multimodal.core.image_budget import Budget
from extensions.multimodal.core.prompt_encoding import PromptEncoder, PromptTooLongError, takes_budget
from extensions.multimodal.core.prompt_parts import PromptPart, count_images, n_tokens
from modules.logging_colors import logger

__all__ = ["MultimodalEmbedder", "Embedded", "EmbeddingCountError", "TooManyImagesError", "PromptTooLongError"]


class TooManyImagesError(ValueError):
    """More images to embed than the pipeline or the `max_images_per_prompt` setting allows."""


@dataclass
class EmbedStats:
    images: int = 0  # images given real embeddings
    from_cache: int = 0
    removed_images: int = 0  # dropped by truncation
    seconds: float = 0.0
    cache_bytes: int = 0  # what the image cache holds after this prompt


@dataclass
class Embedded:
    input_ids: torch.Tensor  # (n,) int64; image rows hold `pad_safe_ids.image_row_id`
    inputs_embeds: torch.Tensor  # (n, hidden)
    route: Optional[Callable]  # the pipeline's `generate_kwargs` result, None when embeddings suffice
    images: int  # images kept in the prompt
    stats: EmbedStats
    image_tokens: List[int]  # per image kept, in prompt order: the prompt tokens it takes


class MultimodalEmbedder:
    def __init__(self, params: dict):
        """`params`: the extension's params; they name the pipeline (`load_pipeline`)."""
        pipeline, _ = load_pipeline(params)
        self.pipeline = pipeline
        self.params = params
        self.prompts = PromptEncoder(pipeline, params)
        self.images = ImageEmbedder(pipeline, params)
        self._owner: tuple = (None, None)  # the (model, tokenizer) the caches were filled with
        self._warned_placeholder_rows = False

    def len_in_tokens(self, prompt: str) -> int:
        """The prompt's length in tokens, images included, at the setting's budget (a picture is decoded
        only where the pipeline lays it out from its pixels: see `prompt_encoding`)."""
        self._reset_caches_if_model_changed()
        return self.prompts.measure(prompt, self._budget({}))

    def forward(self, prompt: str, state: dict) -> Embedded:
        started = time.perf_counter()
        self._reset_caches_if_model_changed()
        stats, budget = EmbedStats(), self._budget(state)
        with torch.inference_mode():
            parts, stats.removed_images = self.prompts.encode(prompt, state, budget)
            self._older_images_as_placeholders(parts)
            self._check_image_limit(parts)
            to_embed = [part for part in parts if part.is_image and part.embedding is None]
            stats.images = len(to_embed)
            stats.from_cache = self.images.embed(to_embed, self.prompts.several(parts), budget)
            self._embed_text(parts)
            input_ids, inputs_embeds = stitch(parts, self.pipeline.name())
            route = self._route(parts, input_ids, inputs_embeds)
            positions = torch.cat([feature_positions(part, self.pipeline) if part.is_image else
                                   torch.zeros_like(part.input_ids, dtype=torch.bool) for part in parts])
            input_ids = unmaskable(input_ids, positions, self.pipeline)
        stats.seconds = time.perf_counter() - started
        stats.cache_bytes = self.images.cache.total_bytes
        tokens = [n_tokens(part) for part in parts if part.is_image]
        return Embedded(input_ids, inputs_embeds, route, count_images(parts), stats, tokens)

    def _budget(self, state: dict) -> Optional[Budget]:
        """The message's or request's budget, else the setting's (checked either way); None for a pipeline
        that takes none."""
        budget = image_budget.resolve(state, self.params)
        return budget if takes_budget(self.pipeline) else None

    def _older_images_as_placeholders(self, parts: List[PromptPart]) -> None:
        """Every image but the last gets placeholder embeddings, unless every image is embedded."""
        embedded = self.prompts.images_to_embed(parts)
        older = [part for part in parts if part.is_image and part.index not in embedded]
        if not older:
            return
        rows = as_rows(self.pipeline.placeholder_embeddings())
        for part in older:
            if n_tokens(part) != rows.shape[0]:
                self._warn_placeholder_rows(n_tokens(part), rows.shape[0])
                part.input_ids = self.prompts.placeholder_ids(rows.shape[0])
            part.embedding = rows

    def _warn_placeholder_rows(self, expected: int, got: int) -> None:
        # MiniGPT-4 and InstructBLIP modules return fewer rows than num_image_embeds(): follow the rows.
        if not self._warned_placeholder_rows:
            self._warned_placeholder_rows = True
            logger.warning(f"Multimodal: pipeline '{self.pipeline.name()}' returns {got} placeholder embedding rows "
                           f"for an image counted as {expected} tokens; using {got} placeholder ids for older images.")

    def _check_image_limit(self, parts: List[PromptPart]) -> None:
        to_embed = sum(1 for part in parts if part.is_image and part.embedding is None)
        limits = [(self.params.get("max_images_per_prompt"), "the multimodal-max_images_per_prompt setting"),
                  (self.pipeline.max_images_per_prompt(), f"the pipeline '{self.pipeline.name()}'")]
        for limit, source in limits:
            if limit is not None and to_embed > int(limit):
                raise TooManyImagesError(
                    f"The prompt has {to_embed} images to embed, but {source} allows at most {int(limit)} per prompt. "
                    f"Send fewer images, or turn off add_all_images_to_prompt so only the last image is embedded.")

    def _embed_text(self, parts: List[PromptPart]) -> None:
        """Token embeddings for the text parts, and for the non-feature ids of images whose ids hold more
        than placeholders (markers, row breaks, tile tokens), in one `pipeline.embed_tokens` call."""
        mixed = [part for part in parts if part.is_image and not bool(feature_positions(part, self.pipeline).all())]
        token_rows = self._embed_tokens([part for part in parts if not part.is_image] + mixed)
        for part in parts:
            if not part.is_image:
                part.embedding = token_rows[id(part)]
        for part in mixed:
            rows = token_rows[id(part)].clone()
            rows[feature_positions(part, self.pipeline)] = feature_rows(part.features).to(rows.device, rows.dtype)
            part.embedding = rows

    def _embed_tokens(self, parts: List[PromptPart]) -> Dict[int, torch.Tensor]:
        """`(n_tokens, hidden)` per part, by id(part)."""
        if not parts:
            return {}
        rows = as_rows(self.pipeline.embed_tokens(torch.cat([part.input_ids for part in parts])))
        return {id(part): embedding for part, embedding in zip(parts, torch.split(rows, [n_tokens(p) for p in parts]))}

    def _route(self, parts: List[PromptPart], input_ids: torch.Tensor, inputs_embeds: torch.Tensor):
        """How the model takes this prompt when it needs more than the embeddings (the pipeline says)."""
        if not overrides(self.pipeline, "generate_kwargs"):
            return None
        images = [part for part in parts if part.is_image]
        return self.pipeline.generate_kwargs(input_ids[None], inputs_embeds[None], [part.layout for part in images],
                                             [part.features for part in images])

    def _reset_caches_if_model_changed(self) -> None:
        owner = loaded_model.identity()
        if owner[0] is not self._owner[0] or owner[1] is not self._owner[1]:
            self.images.cache.clear()
            self.prompts.memo.clear()
            self.prompts.laid_out.clear()
            self._owner = owner


def as_rows(embeddings: torch.Tensor) -> torch.Tensor:
    """`(rows, hidden)`, from a pipeline's `(rows, hidden)` or `(1, rows, hidden)`."""
    return embeddings[0] if embeddings.dim() == 3 and embeddings.shape[0] == 1 else embeddings


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
