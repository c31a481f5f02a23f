"""Content-keyed caches: image embeddings (bounded in bytes) and tokenized text parts.

- `image_cache_key(image_bytes, context)`: a hash of the image bytes plus everything else that
  changes `embed_images`' result (`pipeline_context`: the pipeline's cache key, vision/projector
  device and bits, the codec version). Two images with equal sizes but different pixels have
  different bytes, hence different keys.
- `BoundedLRU`: least-recently-used eviction once the stored values exceed `max_bytes`;
  `max_bytes=0` disables it. Values are stored as given: callers must not modify them. It is
  thread-safe: chat prompts are measured outside the generation lock, by several sessions at once.
This module does not decide what to embed (`prompt_encoding` does) nor embed (`image_embedding` does).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Hashable, Optional

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


def image_cache_key(image_bytes: bytes, context: str) -> str:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(context.encode("utf-8"))
    digest.update(b"\0")
    digest.update(image_bytes)
    return digest.hexdigest()


class BoundedLRU:
    """A dict with least-recently-used eviction, bounded by the byte sizes given to `put`."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 disables the cache), got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.total_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Optional[Any]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Store `value`; one larger than the whole budget is not stored at all."""
        if nbytes > self.max_bytes:
            return
        with self._lock:
            self._pop(key)
            self._entries[key] = (value, nbytes)
            self.total_bytes += nbytes
            while self.total_bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.total_bytes -= evicted

    def _pop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_bytes -= entry[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.total_bytes = 0


def megabytes(value) -> int:
    """A `*_mb` param -> bytes (None and 0 disable)."""
    if value is None:
        return 0
    mb = float(value)
    if mb < 0:
        raise ValueError(f"embedding_cache_mb must be >= 0 (0 disables the cache), got {value!r}")
    return int(mb * 1024 * 1024)
