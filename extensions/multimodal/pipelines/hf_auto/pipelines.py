"""The built-in pipeline module for transformers image-text checkpoints (`AutoModelForImageTextToText`).

- `transformers`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, Mistral 3, Idefics3, SmolVLM, InternVL (hf
  layout), LLaVA-OneVision, Aya Vision, Mllama, LLaVA and LLaVA-NeXT, each through its own processor, vision tower and
  chat template (`transformers_pipeline.py`; routes per family in `routes.py`, FAMILIES.md).
- `llava-hf`: the same pipeline for transformers LLaVA / LLaVA-NeXT models, under its earlier name.
Picked from the loaded model: a model this pipeline serves needs no name. Classes are imported only
when a pipeline is built, so listing the names costs nothing. Module capabilities (core/pipeline_loader):
`serves(model)`, `register_auto_classes()`.
"""
from __future__ import annotations

available_pipelines = ["transformers", "llava-hf"]
LLAVA_HF_TYPES = ("llava", "llava_next")


def get_pipeline(name: str, params: dict):
    """The pipeline called `name`, or None when this module does not provide it."""
    if name not in available_pipelines:
        return None
    from .transformers_pipeline import TransformersPipeline

    return TransformersPipeline(params, name, LLAVA_HF_TYPES if name == "llava-hf" else None)


def get_pipeline_from_model_name(model_name: str, params: dict):
    """A pipeline when the loaded model is one this module serves (the model decides, not its name)."""
    from modules import shared

    if shared.model is None:
        return None
    from .routes import supports

    if not supports(shared.model):
        return None
    return get_pipeline("llava-hf" if shared.model.config.model_type in LLAVA_HF_TYPES else "transformers", params)


def serves(model) -> bool:
    """Capability: `model` is an image-text checkpoint this module serves (a host that builds `generate()`'s
    inputs itself, text-generation-webui, lets the extension generate for it)."""
    from .routes import supports

    return supports(model)


def register_auto_classes() -> list[str]:
    """Capability: text-generation-webui's `AutoModelForCausalLM` loads the families' full classes."""
    from .auto_classes import register_image_text_classes

    return register_image_text_classes()
