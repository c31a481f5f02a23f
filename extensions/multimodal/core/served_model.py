"""The embedder serving the loaded model: built once per model, dropped when the model changes.

`embedder(params)` builds it the first time it is needed after the model changed (the pipeline named
by `--multimodal-pipeline`, the `multimodal-pipeline` setting, or recognised from the model:
`pipeline_loader`); `current_embedder()` and `current_pipeline()` say what serves the loaded model
now without building anything (None before that first time). This module knows nothing about hooks.
"""
from __future__ import annotations

from typing import Any, Optional

from extensions.multimodal.core.multimodal_embedder import MultimodalEmbedder
from modules import shared

_embedder: Optional[MultimodalEmbedder] = None
_model: Any = None  # the model `_embedder` was built for


def current_embedder() -> Optional[MultimodalEmbedder]:
    return _embedder if _embedder is not None and _model is shared.model else None


def current_pipeline():
    current = current_embedder()
    return current.pipeline if current is not None else None


def embedder(params: dict) -> MultimodalEmbedder:
    """The embedder for the loaded model; raises RuntimeError when no model is loaded or no pipeline fits."""
    global _embedder, _model
    if shared.model is None:
        raise RuntimeError("No model is loaded: load one to send it pictures.")
    if current_embedder() is None:
        forget()  # a failed pick leaves no stale embedder behind
        _embedder, _model = MultimodalEmbedder(params), shared.model
    return _embedder


def forget() -> None:
    global _embedder, _model
    _embedder, _model = None, None
