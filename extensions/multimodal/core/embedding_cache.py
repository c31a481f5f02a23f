"""Content-keyed caches: image embeddings (bounded in bytes) and tokenized text parts.

- `image_cache_key(digest, context)`: a hash of the image's digest (`PromptPart.digest`, of its
  base64 data) plus everything else that changes `embed_images`' result (`pipeline_context`: the
  pipeline's cache key, vision/projector device and bits, the codec version). Two images with equal
  sizes but different pixels have different bytes, hence different base64 and keys; a cached picture
  is not decoded to find its key.
- The caches are `BoundedLRU`s (`bounded_lru`), thread-safe: chat prompts are measured outside the
  generation lock, by several sessions at once.
This module does not decide what to embed (`prompt_encoding` does) nor embed (`image_embedding` does).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from extensions.multimodal.core.image_codec import CODEC_VERSION

PARAMS_CHANGING_EMBEDDINGS = ("vision_device", "vision_bits", "projector_device", "projector_bits")


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def nbytes_of(value: Any) -> int:
    """Bytes of the tensors in `value`: a tensor, or a mapping, sequence or object holding tensors."""
    if isinstance(value, torch.Tensor):
        return tensor_nbytes(value)
    if isinstance(value, Mapping):
        return sum(nbytes_of(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(item) for item in value)
    return sum(nbytes_of(item) for item in vars(value).values()) if hasattr(value, "__dict__") else 0


def pipeline_context(pipeline, params: dict) -> str:
    """Everything besides the image bytes that changes a pipeline's image embeddings."""
    key = pipeline.cache_key()
    settings = ",".join(f"{name}={params.get(name)!r}" for name in PARAMS_CHANGING_EMBEDDINGS)
    return f"{type(pipeline).__module__}.{type(pipeline).__qualname__}|{key}|{settings}|codec={CODEC_VERSION}"


def image_cache_key(image_digest: bytes, context: str) -> str:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(context.encode("utf-8"))
    digest.update(b"\0")
    digest.update(image_digest)
    return digest.hexdigest()


def megabytes(value) -> int:
    """A `*_mb` param -> bytes (None and 0 disable)."""
    if value is None:
        return 0
    mb = float(value)
    if mb < 0:
        raise ValueError(f"embedding_cache_mb must be >= 0 (0 disables the cache), got {value!r}")
    return int(mb * 1024 * 1024)
