"""The built-in pipeline module for the original LLaVA releases: the names it serves and how to pick one.

Original releases (a CLIP tower plus `mm_projector` weights): llava-7b, llava-13b, llava-llama-2-13b,
llava-v1.5-7b, llava-v1.5-13b (`original.py`, one spec per name in `specs.py`). transformers LLaVA
models (llava-hf) are served by `pipelines/hf_auto`. Classes are imported only when a pipeline is
built, so listing the names costs nothing.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

ORIGINAL_PIPELINES = ["llava-7b", "llava-13b", "llava-llama-2-13b", "llava-v1.5-7b", "llava-v1.5-13b"]
available_pipelines = list(ORIGINAL_PIPELINES)

# Names of LLaVA variants the original pipelines do not serve: seeing one, the name decides nothing.
OTHER_VARIANT_RE = re.compile(r"v?1[._-]6(?!\d)|next|onevision|interleave|video|llama-?3|mistral|phi|qwen|gemma|-hf\b")
SIZE_RE = re.compile(r"(?<![\d.])(7|13)b(?![a-z0-9])")
V15_RE = re.compile(r"v1[._-]5(?![\d])|llava-1[._-]5(?![\d])")
LLAMA2_RE = re.compile(r"llama-?2(?![\d])")


def get_pipeline(name: str, params: dict):
    """The pipeline called `name`, or None when this module does not provide it."""
    if name in ORIGINAL_PIPELINES:
        from .original import OriginalLlavaPipeline
        from .specs import get_spec

        return OriginalLlavaPipeline(get_spec(name), params)
    return None


# LM widths of the published releases: a name without a size takes it from the loaded model.
SIZE_BY_WIDTH = {4096: "7b", 5120: "13b"}


def pipeline_name_for(model_name: str, model_width: Optional[int] = None) -> Optional[str]:
    """The original pipeline a model name clearly belongs to, else None.

    The name must say LLaVA and its release (a size, a version, or both). A name without a size
    ("llava-v1.5") takes it from `model_width`, the loaded LM's hidden size: 5120 is 13B, any other
    width 7B (the projector's shape check then rejects a model that is neither).
    """
    name = Path(model_name).name.lower()  # the folder's own name, not the folders above it
    if "llava" not in name or OTHER_VARIANT_RE.search(name):
        return None
    size = SIZE_RE.search(name)
    if size is not None:
        size_tag = f"{size.group(1)}b"
    elif model_width is not None and V15_RE.search(name):
        size_tag = SIZE_BY_WIDTH.get(model_width, "7b")
    else:
        return None
    if V15_RE.search(name):
        return f"llava-v1.5-{size_tag}"
    if LLAMA2_RE.search(name):
        return "llava-llama-2-13b" if size_tag == "13b" else None
    return f"llava-{size_tag}"  # v0: the first release carried no version in its name


def get_pipeline_from_model_name(model_name: str, params: dict):
    """A pipeline when the choice is certain: an original checkpoint's name gives its release.
    Otherwise None (the user names one)."""
    from modules import shared

    width = None
    if shared.model is not None:
        if getattr(shared.model.config, "model_type", None) not in ("llama", "llava_llama"):
            return None  # original LLaVA releases are Llama language models
        width = getattr(shared.model.config, "hidden_size", None)
    name = pipeline_name_for(model_name, width)
    return get_pipeline(name, params) if name is not None else None
