"""Pictures in, feature rows out: `pipeline.embed_images` in one batch, behind a content-keyed cache.

`ImageEmbedder.embed(parts, several)` gives each image part its features (as `embed_images`
returned them: see `feature_rows`) and its embedding rows `(rows, hidden)`, checked against the
placeholder count its ids hold. Pictures are decoded here only when they miss the cache and were not
kept from laying them out (`PromptPart.picture`); what the pipeline prepared then
(`ImageLayout.prepared`) goes back to it (`embed_images(..., prepared=[...])`). The cache key is the
picture's digest (of its base64 data: a cached picture is not decoded) plus everything else that
changes its rows (`pipeline_context`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from extensions.multimodal.abstract_pipeline import feature_rows
from extensions.multimodal.core.defaults import max_image_pixels, with_defaults
from extensions.multimodal.core.bounded_lru import BoundedLRU
from extensions.multimodal.core.embedding_cache import image_cache_key, megabytes, pipeline_context, tensor_nbytes
from extensions.multimodal.core.image_budget import Budget
from extensions.multimodal.core.image_codec import b64_to_bytes, decode_image_bytes, image_label
from extensions.multimodal.core.prompt_parts import PromptPart


class EmbeddingCountError(RuntimeError):
    """A pipeline returned a number of embedding rows that differs from the placeholder tokens."""


class ImageEmbedder:
    def __init__(self, pipeline, params: dict):
        self.pipeline = pipeline
        self.params = params
        self.cache = BoundedLRU(megabytes(with_defaults(params)["embedding_cache_mb"]))

    def embed(self, parts: List[PromptPart], several: bool = False, budget: Optional[Budget] = None) -> int:
        """Features for every image part in `parts`; returns how many came from the cache. `budget`: for
        pipelines that take one (`prompt_encoding.takes_budget`), else None."""
        if not parts:
            return 0
        context = pipeline_context(self.pipeline, self.params) + ("|one of several" if several else "") + \
            (f"|budget={budget.name}" if budget is not None else "")
        keys = [image_cache_key(part.digest, context) for part in parts]
        found: Dict[str, torch.Tensor] = {}
        for key in dict.fromkeys(keys):
            cached = self.cache.get(key)
            if cached is not None:
                found[key] = cached
        from_cache = sum(1 for key in keys if key in found)
        misses = {key: part for key, part in zip(keys, parts) if key not in found}  # one part per distinct image
        if misses:
            found.update(self.embed_misses(misses, several, budget))
        for key, part in zip(keys, parts):
            part.features, part.embedding = found[key], feature_rows(found[key])
        return from_cache

    def embed_misses(self, misses: Dict[str, PromptPart], several: bool,
                     budget: Optional[Budget]) -> Dict[str, torch.Tensor]:
        """`misses`: per cache key, an image part."""
        parts = list(misses.values())
        images = [part.picture if part.picture is not None else
                  decode_image_bytes(image_bytes(part), max_image_pixels(self.params), image_label(part.index))
                  for part in parts]
        kwargs = ({"several": True} if several else {}) | ({"budget": budget} if budget is not None else {})
        prepared = [part.layout.prepared if part.layout is not None else None for part in parts]
        if all(one is not None for one in prepared):  # only pipelines whose layouts prepared something get it back
            kwargs["prepared"] = prepared
        output = self.pipeline.embed_images(images, **kwargs)
        counts = [int(feature_positions(part, self.pipeline).sum()) for part in parts]
        fresh = dict(zip(misses, split_image_rows(output, counts, self.pipeline.name())))
        for key, embedding in fresh.items():
            self.cache.put(key, embedding, tensor_nbytes(embedding))
        return fresh


def image_bytes(part: PromptPart) -> bytes:
    return b64_to_bytes(part.b64, image_label(part.index))


def feature_positions(part: PromptPart, pipeline) -> torch.Tensor:
    """`(n,)` bool: the positions of an image part that take feature rows."""
    return part.input_ids == int(pipeline.placeholder_token_id())


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
        f"for them ({', '.join(map(str, counts))} per image: the positions among each image's ids, from "
        f"image_layout(), by default num_image_embeds_for() placeholders, that hold placeholder_token_id()). "
        f"The pipeline's layout and embed_images() disagree: check that both follow the model's vision tower.")
