"""`llava-hf`: transformers LLaVA-family models (`LlavaForConditionalGeneration`, `LlavaNextForConditionalGeneration`).

The vision tower and projector live inside the loaded model; this pipeline runs them through the
model's own `get_image_features` (feature layer, CLS handling, NeXT's anyres packing and
`image_newline` included) with the model's own image processor (`loaded_model.processor()`), so the
embeddings are exactly those the model would insert for its `<image>` tokens. No second copy of
the tower is loaded. Per-image token counts come from the processor (they vary with the image size
for LLaVA-NeXT).
"""
from __future__ import annotations

from typing import List, Optional

import torch
from PIL import Image

from extensions.multimodal import loaded_model
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline
from extensions.multimodal.defaults import with_defaults
from modules.logging_colors import logger

from . import common

# config.model_type values whose get_image_features / processor this pipeline is tested against.
SUPPORTED_MODEL_TYPES = ("llava", "llava_next")


def is_llava_hf_model(model) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES and hasattr(model, "get_image_features")


def inner_model(model):
    """The module holding `vision_tower` / `multi_modal_projector` (`model.model` in transformers 5)."""
    return model.model if hasattr(model, "model") and hasattr(model.model, "vision_tower") else model


def count_by_expanding(processor, image_token_id: int, height: int, width: int) -> int:
    """Image tokens the processor writes for one blank image of this size (for processors without
    `_get_num_multimodal_tokens`)."""
    ids = processor(text=processor.image_token, images=[Image.new("RGB", (width, height))],
                    return_tensors="pt")["input_ids"]
    return int((ids == image_token_id).sum())


class LlavaHfPipeline(AbstractMultimodalPipeline):
    def __init__(self, params: dict):
        params = with_defaults(params)
        model = loaded_model.require_model()
        if not is_llava_hf_model(model):
            raise ValueError(f"The 'llava-hf' pipeline needs a transformers LLaVA model "
                             f"(model_type {' or '.join(SUPPORTED_MODEL_TYPES)}); the loaded model is "
                             f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')}). For original "
                             f"LLaVA checkpoints use llava-7b, llava-13b, llava-llama-2-13b or llava-v1.5-7b/13b.")
        processor = loaded_model.processor()
        if getattr(processor, "image_processor", None) is None:
            raise ValueError("The 'llava-hf' pipeline needs the model's AutoProcessor with an image processor "
                             "(the model folder's processor_config.json / preprocessor_config.json).")
        self.model = model
        self.processor = processor
        self.config = model.config
        self.vision_device, self.vision_dtype = self._place_vision(params)

    def _place_vision(self, params: dict) -> tuple[torch.device, torch.dtype]:
        """Move/cast the tower and projector as `vision_device` / `vision_bits` say (None: leave as loaded).

        Both go together: `get_image_features` feeds the tower's output straight into the projector.
        (`projector_device` / `projector_bits` have no separate meaning here.)
        """
        inner = inner_model(self.model)
        parts = [inner.vision_tower, inner.multi_modal_projector]
        current = next(inner.vision_tower.parameters())
        device = torch.device(params["vision_device"]) if params["vision_device"] is not None else current.device
        dtype = current.dtype if params["vision_bits"] is None else self._get_dtype("vision_bits", params)
        if any(not p.is_floating_point() for part in parts for p in part.parameters()):
            logger.warning("llava-hf: the vision tower is quantized; vision_bits/vision_device are not applied to it.")
            return current.device, current.dtype
        if (device, dtype) != (current.device, current.dtype):
            logger.info(f"llava-hf: vision tower and projector to {dtype} on {device}")
            for part in parts:
                part.to(device=device, dtype=dtype)
        return device, dtype

    # -- AbstractMultimodalPipeline -------------------------------------------------------------

    @staticmethod
    def name() -> str:
        return "llava-hf"

    def image_start(self) -> str:
        return getattr(self.processor, "image_start_token", None) or ""

    def image_end(self) -> str:
        return getattr(self.processor, "image_end_token", None) or ""

    def placeholder_token_id(self) -> int:
        return int(self.config.image_token_id)

    def num_image_embeds(self) -> int:
        """Tokens of a square image at the tower's resolution (LLaVA-NeXT: see num_image_embeds_for)."""
        side = self.config.vision_config.image_size
        return self._count_tokens(side, side)

    def num_image_embeds_for(self, image: Image.Image) -> int:
        """Tokens this image takes, as the model's processor counts them for its `<image>` token."""
        width, height = image.size
        return self._count_tokens(height, width)

    def _count_tokens(self, height: int, width: int) -> int:
        count = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if count is not None:  # the processor's own arithmetic (what vLLM uses); no pixels needed
            return int(count(image_sizes=[[height, width]]).num_image_tokens[0])
        return count_by_expanding(self.processor, self.placeholder_token_id(), height, width)

    @staticmethod
    def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
        return common.embed_tokens(input_ids)

    def placeholder_embeddings(self) -> torch.Tensor:
        """`(num_image_embeds, hidden)`: the image token's embedding repeated."""
        ids = torch.full((self.num_image_embeds(),), self.placeholder_token_id(), dtype=torch.long)
        return common.embed_tokens(ids)

    def preprocess(self, images: List[Image.Image]) -> dict[str, torch.Tensor]:
        """The image processor's tensors (`pixel_values`, and `image_sizes` for NeXT) for the tower."""
        processed = self.processor.image_processor([image.convert("RGB") for image in images], return_tensors="pt")
        inputs = {"pixel_values": processed["pixel_values"].to(self.vision_device, self.vision_dtype)}
        if "image_sizes" in processed:
            inputs["image_sizes"] = processed["image_sizes"].to(self.vision_device)
        return inputs

    def embed_images(self, images: List[Image.Image]) -> torch.Tensor:
        """The features the model would insert for these images, from one batched forward.

        Plain LLaVA (a fixed count per image): `(num_images, tokens, hidden)`. LLaVA-NeXT (the count
        varies with the image size): `(total_tokens, hidden)`, image i's `num_image_embeds_for(images[i])`
        rows in order. The shape depends on the model, never on the images given.
        """
        if not images:
            raise ValueError("embed_images needs at least one image, got 0")
        inputs = self.preprocess(images)
        with torch.inference_mode():
            output = self.model.get_image_features(**inputs)
        # transformers 5 returns a ModelOutput whose pooler_output holds one tensor per image.
        per_image = [f.reshape(-1, f.shape[-1]) for f in getattr(output, "pooler_output", output)]
        joined = torch.stack(per_image) if self.config.model_type == "llava" else torch.cat(per_image)
        return common.to_model(joined)

    # -- Optional capabilities ------------------------------------------------------------------

    def preferred_image_size(self) -> Optional[int]:
        return None  # the processor resizes/crops by the short side or by resolution grids

    def cache_key(self) -> str:
        return (f"llava-hf|{getattr(self.config, '_name_or_path', '')}|{self.vision_dtype}@{self.vision_device}")
