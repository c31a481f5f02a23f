"""`TransformersPipeline`: any loaded `AutoModelForImageTextToText` checkpoint, through its own parts.

The checkpoint's processor (`loaded_model.processor()`) lays out each image (`image_tokens`: every id it
writes, markers and row breaks included) and prepares its pixels; the model's own `get_image_features`
embeds them (`image_features`; Mllama: `cross_attention`); the family's route (`routes`) says how the
language model takes the prompt. No resize, crop or normalisation is written here, and the vision
tower is the loaded model's: no second copy.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from PIL import Image

from extensions.multimodal.core import loaded_model
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline, ImageLayout
from extensions.multimodal.core.defaults import with_defaults
from modules.logging_colors import logger

from . import budget_kwargs, cross_attention, routes
from .image_features import features_of, vision_parts
from .image_tokens import image_token_id, process_images, tag_text, with_company
from .processor_route import processor_inputs
from .split_devices import align_devices

# Families whose processor lays out a picture differently once the conversation holds several.
SEVERAL_CHANGE_LAYOUT = ("llava_onevision",)


class TransformersPipeline(AbstractMultimodalPipeline):
    def __init__(self, params: dict, name: str = "transformers", model_types: Optional[tuple] = None):
        params = with_defaults(params)
        model = loaded_model.require_model()
        routes.check_serves(name, model, model_types)
        self._name, self.model, self.processor = name, model, loaded_model.processor()
        self.route, self.image_id = routes.route_for(model), image_token_id(model)
        self.tag = tag_text(self.processor, self.image_id, routes.not_exact_here(model))
        if self.tag.not_exact_here:
            logger.info(f"Multimodal: {type(model).__name__} through its processor, the tower inside generate on "
                        f"every turn: {self.tag.not_exact_here}")
        self.vision_device, self.vision_dtype = self._place_vision(params)

    def _place_vision(self, params: dict) -> tuple[torch.device, torch.dtype]:
        """Move/cast the tower and projector as `vision_device` / `vision_bits` say (they run as one)."""
        parts = vision_parts(self.model)
        current = next(p for part in parts for p in part.parameters())
        device = torch.device(params["vision_device"]) if params["vision_device"] is not None else current.device
        dtype = current.dtype if params["vision_bits"] is None else self._get_dtype("vision_bits", params, device)
        if any(not p.is_floating_point() for part in parts for p in part.parameters()):
            logger.warning(f"{self._name}: the vision tower is quantized; vision_bits/vision_device are not applied.")
            return current.device, current.dtype
        lm_dtype = loaded_model.placement()[1]
        if self.route == routes.CROSS_ATTENTION and dtype != lm_dtype:
            # transformers' MllamaModel builds the text's cross-attention mask in `self.dtype`, its first
            # weights' (the vision model's): in another dtype than the language model's, attention fails.
            raise ValueError(f"vision_bits={params['vision_bits']!r} puts {type(self.model).__name__}'s vision model "
                             f"in {dtype}, but its language model is in {lm_dtype}: transformers builds this "
                             f"family's cross-attention mask in the vision model's dtype, which its language "
                             f"model's attention refuses. Leave vision_bits unset (vision_device alone works).")
        if (device, dtype) != (current.device, current.dtype):
            logger.info(f"{self._name}: vision tower and projector to {dtype} on {device}")
            for part in parts:
                part.to(device=device, dtype=dtype)
        if align_devices(self.model, parts, loaded_model.placement()[0], device):
            logger.info(f"{self._name}: the language model takes its inputs on {loaded_model.placement()[0]}, "
                        f"the tower on {device}")
        return device, dtype

    def name(self) -> str:
        return self._name

    def image_start(self) -> str:
        return self.tag.before

    def image_end(self) -> str:
        return self.tag.after

    def placeholder_token_id(self) -> int:
        return self.image_id

    def num_image_embeds(self) -> int:  # a square picture's rows; most families vary per image (`image_layout`)
        return self.tag.tokens_per_image

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return loaded_model.embed_tokens(input_ids)

    def placeholder_embeddings(self) -> torch.Tensor:
        return self.embed_tokens(torch.full((self.tag.tokens_per_image,), self.image_id, dtype=torch.long))

    def embed_images(self, images: List[Image.Image], several: bool = False, budget=None,
                     prepared: Optional[list] = None) -> List[torch.Tensor]:
        """`(rows, hidden)` per image from one batched `get_image_features`, on the LM's device and dtype
        (Qwen3-VL: `(rows, 1 + DeepStack layers, hidden)`); `budget`: None for the checkpoint's settings.
        `prepared`: each image's `image_layout(...).prepared`, used for one image (processed as here); several
        new images go through the processor together, as Hugging Face's do."""
        if not images:
            raise ValueError("embed_images needs at least one image, got 0")
        one = prepared is not None and len(images) == 1
        processed = prepared[0] if one else self._process(with_company(images, several), several, budget)
        if self.route == routes.CROSS_ATTENTION:
            rows = cross_attention.image_features(self.model, processed)
        else:
            rows, deepstack = features_of(self.model, processed)
            if deepstack is not None:  # (layers, rows, hidden) per image
                rows = [torch.cat([r[:, None], d.transpose(0, 1)], dim=1) for r, d in zip(rows, deepstack)]
        device, dtype = loaded_model.placement()
        return [r.to(device, dtype) for r in rows[:len(images)]]

    def image_layout(self, image: Image.Image, several: bool = False, budget=None) -> ImageLayout:
        processed = self._process(with_company([image], several), several, budget)
        grid = processed.inputs.get("image_grid_thw")
        info = {"tiles": cross_attention.tiles_per_image(processed)[0]} if self.route == routes.CROSS_ATTENTION \
            else {"image_grid_thw": grid[:1]} if grid is not None else {}
        return ImageLayout(processed.tokens[0].ids, info, prepared=processed)

    def _process(self, images: List[Image.Image], several: bool, budget):
        return process_images(self.processor, images, several, self.processor_kwargs(budget))

    def processor_kwargs(self, budget) -> dict:
        return budget_kwargs.images_kwargs(self.model.config.model_type, self.processor.image_processor, budget)

    def budget_knob(self) -> Optional[str]:
        return budget_kwargs.knob(self.model.config.model_type)

    def layout_depends_on_count(self) -> bool:
        return self.model.config.model_type in SEVERAL_CHANGE_LAYOUT

    def generate_kwargs(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor, layouts: List[ImageLayout],
                        features: List[torch.Tensor]) -> Callable[[int, object], dict]:
        return routes.route_kwargs(self.model, self.route, input_ids, inputs_embeds, layouts, features)

    def prompt_text(self, prompt: str) -> str:  # only Mllama's processor rewrites the text
        if self.route != routes.CROSS_ATTENTION:
            return prompt
        return cross_attention.with_bos(prompt, getattr(self.processor.tokenizer, "bos_token", None))

    def chat_template_placeholder(self) -> Optional[str]:
        return self.tag.text

    def features_exact_here(self) -> bool:
        return not self.tag.not_exact_here

    def processor_inputs(self, prompt: str, add_bos: bool, max_pixels: int, budget=None):
        """`model.generate(**inputs)` runs the tower itself (`processor_route.py`)."""
        return processor_inputs(self.processor, prompt, add_bos, max_pixels, self.processor_kwargs(budget))

    def embeds_all_images(self) -> bool:
        return True  # the model's own processor embeds every image of a conversation

    def cache_key(self) -> str:
        return (f"{self._name}|{getattr(self.model.config, '_name_or_path', '')}"
                f"|{self.vision_dtype}@{self.vision_device}")
