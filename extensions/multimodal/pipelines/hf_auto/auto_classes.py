"""Image-text checkpoints through a loader that knows only `AutoModelForCausalLM`.

text-generation-webui's Transformers loader loads every folder with `AutoModelForCausalLM`, which
in transformers 5.6 refuses Qwen2-VL, LLaVA, SmolVLM and the rest ("Unrecognized configuration
class") and loads Mllama without its vision model. transformers' public registration API
(`AutoModelForCausalLM.register`) maps each such config to its full image-text class, the one
`AutoModelForImageTextToText` loads, for this process. Families the loader already loads whole
(Gemma 3) are left as they are; nothing else changes.

It takes effect for loads after it ran: the Model tab and the API's model-load endpoint, not a
`--model` that the host loaded before any extension (see the extension's README).
"""
from __future__ import annotations

from .routes import ROUTES


def register_image_text_classes() -> list[str]:
    """Register every family in `ROUTES` this transformers has; returns the model types registered."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    registered = []
    for model_type in ROUTES:
        full_class = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
        if full_class is None or model_type not in CONFIG_MAPPING_NAMES:
            continue  # not in this transformers
        if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) == full_class:
            continue  # loaded whole already
        config_class = getattr(transformers, CONFIG_MAPPING_NAMES[model_type])
        AutoModelForCausalLM.register(config_class, getattr(transformers, full_class), exist_ok=True)
        registered.append(model_type)
    return registered
