"""`TransformersPipeline`: any loaded `AutoModelForImageTextToText` checkpoint, through its own parts.

The checkpoint's processor (`loaded_model.processor()`: as is, or built from its PIL parts without
torchvision) lays out each image (`image_tokens`: every id it writes, markers and row breaks
included) and prepares its pixels; the model's own `get_image_features` embeds them
(`image_features`); the family's route (`routes`) says how the language model takes the prompt.
No resize, crop or normalisation is written here. The vision tower is the loaded model's: no second
copy. Qwen3-VL's DeepStack rows travel with each image's features (`feature_rows`), so the embedding
cache keeps them too. Mllama's images are no rows of the prompt: its features are the states its
cross-attention layers read, after one row for the `<|image|>` token (see `cross_attention.py`).
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional

import torch
from PIL import Image

from extensions.multimodal.core import loaded_model
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline, ImageLayout, feature_rows
from extensions.multimodal.core.defaults import with_defaults
from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
from modules.logging_colors import logger

from . import budget_kwargs, cross_attention, routes
from .image_features import features_of, vision_parts
from .image_tokens import LayoutUnavailable, image_placeholder, image_text, image_token_id, process_images
from .processor_route import processor_inputs

BLANK_SIDE = 224  # the picture whose layout gives num_image_embeds() and the text around every image
LEADING_IMAGES = re.compile(f"(?:{IMAGE_TAG_RE.pattern})*")
# Families whose processor lays out a picture differently once the conversation holds several.
SEVERAL_CHANGE_LAYOUT = ("llava_onevision",)


def supports(model) -> bool:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in routes.ROUTES:
        return False
    return routes.ROUTES[model_type] == routes.CROSS_ATTENTION or hasattr(model, "get_image_features")


def with_company(images: List[Image.Image], several: bool) -> List[Image.Image]:
    """A lone image of a prompt holding several goes with a copy of itself, so the processor lays it
    out as one of several (what it is in its prompt); the copy's share is dropped by the caller."""
    return list(images) + list(images[:1]) if several and len(images) == 1 else list(images)


class TransformersPipeline(AbstractMultimodalPipeline):
    def __init__(self, params: dict, name: str = "transformers", model_types: Optional[tuple] = None):
        params = with_defaults(params)
        model = loaded_model.require_model()
        model_type = getattr(model.config, "model_type", None)
        if model_types is not None and model_type not in model_types:
            raise ValueError(f"The '{name}' pipeline serves {', '.join(model_types)} models; the loaded model is "
                             f"{type(model).__name__} ({model_type}). Use the 'transformers' pipeline.")
        if not supports(model):
            raise ValueError(f"The '{name}' pipeline cannot serve {type(model).__name__} ({model_type}): it is not "
                             f"an image-text model this pipeline knows (known: {', '.join(sorted(routes.ROUTES))}).")
        self._name, self.model, self.processor = name, model, loaded_model.processor()
        self.route = routes.route_for(model)
        self.image_id = image_token_id(model)
        # A tag stands for one image part as the chat template writes it (Qwen: the placeholder between
        # <|vision_start|> and <|vision_end|>); the text around the placeholder, and the plain text the
        # processor writes around every image's special tokens (Gemma 3: "\n\n"), belong to the
        # neighbouring text parts, encoded with them, as the processor tokenizes the whole prompt.
        self.image_text = image_text(self.processor)
        prefix, _, suffix = self.image_text.partition(image_placeholder(self.processor))
        blank, self.not_exact_here = self._blank_layout()
        if blank is None:
            logger.info(f"Multimodal: {type(model).__name__} through its processor, the tower inside generate on "
                        f"every turn: {self.not_exact_here}")
            self.before, self.after, self.tokens_per_image = prefix, suffix, 0
        else:
            self.before, self.after = prefix + blank.before, blank.after + suffix
            self.tokens_per_image = int((blank.ids == self.image_id).sum())
        self.vision_device, self.vision_dtype = self._place_vision(params)

    def _blank_layout(self):
        """(a blank picture's tokens, "") where the installed transformers gives this family's features
        exactly; else (None, why not): the "ids+features" and cross-attention routes need transformers
        5.23 (`routes.routes_here`), and before 5.23 a processor that writes plain text with a picture
        does not say where (`image_tokens.LayoutUnavailable`)."""
        if not routes.routes_here(self.model):
            import transformers

            return None, f"transformers {transformers.__version__} cannot take its precomputed features (5.23 can)"
        try:
            return process_images(self.processor, [Image.new("RGB", (BLANK_SIDE, BLANK_SIDE))]).tokens[0], ""
        except LayoutUnavailable as error:
            return None, str(error)

    def _place_vision(self, params: dict) -> tuple[torch.device, torch.dtype]:
        """Move/cast the tower and projector as `vision_device` / `vision_bits` say (they run as one)."""
        parts = vision_parts(self.model)
        current = next(p for part in parts for p in part.parameters())
        device = torch.device(params["vision_device"]) if params["vision_device"] is not None else current.device
        dtype = current.dtype if params["vision_bits"] is None else self._get_dtype("vision_bits", params, device)
        if any(not p.is_floating_point() for part in parts for p in part.parameters()):
            logger.warning(f"{self._name}: the vision tower is quantized; vision_bits/vision_device are not applied.")
            return current.device, current.dtype
        if (device, dtype) != (current.device, current.dtype):
            logger.info(f"{self._name}: vision tower and projector to {dtype} on {device}")
            for part in parts:
                part.to(device=device, dtype=dtype)
        return device, dtype

    # -- AbstractMultimodalPipeline ---------------------------------------------------------------

    def name(self) -> str:
        return self._name

    def image_start(self) -> str:
        return self.before

    def image_end(self) -> str:
        return self.after

    def placeholder_token_id(self) -> int:
        return self.image_id

    def num_image_embeds(self) -> int:
        """Feature rows of a square picture (the count varies per image in most families: `image_layout`)."""
        return self.tokens_per_image

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return loaded_model.embed_tokens(input_ids)

    def placeholder_embeddings(self) -> torch.Tensor:
        return self.embed_tokens(torch.full((self.tokens_per_image,), self.image_id, dtype=torch.long))

    def embed_images(self, images: List[Image.Image], several: bool = False, budget=None) -> List[torch.Tensor]:
        """`(rows, hidden)` per image, from one batched `get_image_features`, on the LM's device and dtype;
        Qwen3-VL: `(rows, 1 + DeepStack layers, hidden)` (see `feature_rows`).

        `several`: the images belong to a prompt holding more than one (`layout_depends_on_count`);
        `budget`: what each may cost (`image_budget.Budget`; None: the checkpoint's settings).
        """
        if not images:
            raise ValueError("embed_images needs at least one image, got 0")
        processed = self._process(with_company(images, several), several, budget)
        if self.route == routes.CROSS_ATTENTION:
            rows = cross_attention.image_features(self.model, processed)
        else:
            rows, deepstack = features_of(self.model, processed)
            if deepstack is not None:  # (layers, rows, hidden) per image
                rows = [torch.cat([r[:, None], d.transpose(0, 1)], dim=1) for r, d in zip(rows, deepstack)]
        device, dtype = loaded_model.placement()
        return [r.to(device, dtype) for r in rows[:len(images)]]

    # -- Optional capabilities --------------------------------------------------------------------

    def image_layout(self, image: Image.Image, several: bool = False, budget=None) -> ImageLayout:
        processed = self._process(with_company([image], several), several, budget)
        grid = processed.inputs.get("image_grid_thw")
        if self.route == routes.CROSS_ATTENTION:
            return ImageLayout(processed.tokens[0].ids, {"tiles": cross_attention.tiles_per_image(processed)[0]})
        return ImageLayout(processed.tokens[0].ids, {"image_grid_thw": grid[:1]} if grid is not None else {})

    def _process(self, images: List[Image.Image], several: bool, budget):
        return process_images(self.processor, images, several, self.processor_kwargs(budget))

    def processor_kwargs(self, budget) -> dict:
        """The processor's keyword arguments for a picture budget (none for the default, or a family without a knob)."""
        return budget_kwargs.images_kwargs(self.model.config.model_type, self.processor.image_processor, budget)

    def budget_knob(self) -> Optional[str]:
        """What a picture budget changes for this family (`budget_kwargs`); None: every picture costs the same."""
        return budget_kwargs.knob(self.model.config.model_type)

    def layout_depends_on_count(self) -> bool:
        """Whether a picture's layout and rows change once its prompt holds several (LLaVA-OneVision);
        then `image_layout` and `embed_images` take `several`."""
        return self.model.config.model_type in SEVERAL_CHANGE_LAYOUT

    def generate_kwargs(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor, layouts: List[ImageLayout],
                        features: List[torch.Tensor]) -> Callable[[int, object], dict]:
        if self.route == routes.EMBEDS:  # with the real image ids (the host's may stand in for a pad id)
            return lambda cached_length, cache: routes.embeds_kwargs(input_ids, inputs_embeds)
        if any(f is None for f in features):
            raise ValueError(f"{type(self.model).__name__} needs every image of the prompt embedded (its positions "
                             f"or its image features cover them all): set multimodal-add_all_images_to_prompt "
                             f"to true, or leave it unset.")
        if self.route == routes.CROSS_ATTENTION:
            tiles = [layout.info["tiles"] for layout in layouts]
            return lambda cached_length, cache: cross_attention.route_kwargs(self.model, input_ids, features, tiles,
                                                                             cached_length, cache)
        grids = [layout.info["image_grid_thw"] for layout in layouts if "image_grid_thw" in layout.info]
        grid = torch.cat(grids) if grids else None
        if self.route == routes.EMBEDS_MROPE:
            kwargs = routes.mrope_kwargs(self.model, input_ids, inputs_embeds, grid)
            return lambda cached_length, cache: kwargs  # covers the full prompt; generate() slices what is cached
        rows = [feature_rows(f) for f in features]
        deepstack = [f[:, 1:].transpose(0, 1) for f in features] if features and features[0].dim() == 3 else None
        return lambda cached_length, cache: routes.features_kwargs(self.model, input_ids, rows, deepstack=deepstack,
                                                                   image_grid_thw=grid, cached_length=cached_length)

    def prompt_text(self, prompt: str) -> str:
        """Mllama's processor writes a BOS, after any leading images, into a text that holds none (its
        `build_string_from_input`); the other families' processors keep the text as it is."""
        bos = getattr(self.processor.tokenizer, "bos_token", None)
        if self.route != routes.CROSS_ATTENTION or not bos or bos in prompt:
            return prompt
        start = LEADING_IMAGES.match(prompt).end()
        return prompt[:start] + bos + prompt[start:]

    def chat_template_placeholder(self) -> Optional[str]:
        return self.image_text

    def features_exact_here(self) -> bool:
        """Whether this family's features and route give Hugging Face's tokens with the installed
        transformers; where not, a host that takes no routes uses `processor_inputs` instead."""
        return not self.not_exact_here

    def processor_inputs(self, prompt: str, add_bos: bool, max_pixels: int, budget=None):
        """The checkpoint's own processor inputs for `prompt` (tags standing for image parts), its pictures at
        `budget`: `model.generate(**inputs)` runs the tower itself (`processor_route.py`)."""
        kwargs = budget_kwargs.images_kwargs(self.model.config.model_type, self.processor.image_processor, budget)
        return processor_inputs(self.processor, prompt, add_bos, max_pixels, kwargs)

    def embeds_all_images(self) -> bool:
        return True  # the model's own processor embeds every image of a conversation

    def cache_key(self) -> str:
        return (f"{self._name}|{getattr(self.model.config, '_name_or_path', '')}"
                f"|{self.vision_dtype}@{self.vision_device}")
