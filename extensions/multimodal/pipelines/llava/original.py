"""Original LLaVA releases (a CLIP tower plus `mm_projector`) as one pipeline class driven by a `LlavaSpec`.

In: PIL images. Out: `(num_images, tokens_per_image, lm_hidden)` embeddings on the LM's device and
dtype: CLIP hidden state `spec.feature_layer` without the CLS position, through the projector.
The tower and projector are loaded once, in the dtype and on the device the params name.
"""
from __future__ import annotations

from typing import List

import torch
from PIL import Image

from extensions.multimodal.core import loaded_model
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline
from extensions.multimodal.core.defaults import with_defaults
from modules import shared
from modules.logging_colors import logger

from . import weights
from .specs import LlavaSpec


PROJECTOR_KEYS = {
    "linear": {"weight", "bias"},
    "mlp2x_gelu": {"0.weight", "0.bias", "2.weight", "2.bias"},
}


def build_projector(spec: LlavaSpec, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The projector the spec names, shaped by (and loaded with) `state`."""
    expected = PROJECTOR_KEYS[spec.projector_type]
    if set(state) != expected:
        raise ValueError(f"The mm_projector weights hold {sorted(state)}, but the '{spec.name}' pipeline "
                         f"({spec.projector_type}) expects {sorted(expected)}: is it the right pipeline for this model?")
    if spec.projector_type == "linear":
        projector = torch.nn.Linear(state["weight"].shape[1], state["weight"].shape[0])
    else:
        first, second = state["0.weight"], state["2.weight"]
        projector = torch.nn.Sequential(torch.nn.Linear(first.shape[1], first.shape[0]), torch.nn.GELU(),
                                        torch.nn.Linear(second.shape[1], second.shape[0]))
    projector.load_state_dict(state)
    return projector


def linear_layers(projector: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in projector.modules() if isinstance(m, torch.nn.Linear)]


def expand_to_square(image: Image.Image, fill: tuple[int, ...]) -> Image.Image:
    """LLaVA-1.5's `expand2square`: centre the image on a square of the processor's mean colour."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    result = Image.new(image.mode, (side, side), fill)
    result.paste(image, ((side - width) // 2, (side - height) // 2))
    return result


class OriginalLlavaPipeline(AbstractMultimodalPipeline):
    """One original LLaVA release; `spec` holds everything that differs between releases."""

    def __init__(self, spec: LlavaSpec, params: dict):
        params = with_defaults(params)
        self.spec = spec
        placement = loaded_model.placement()  # None settings mean the language model's device and dtype
        self.vision_device = self._get_device("vision_device", params, placement)
        self.vision_dtype = self._get_dtype("vision_bits", params, self.vision_device, placement)
        self.projector_device = self._get_device("projector_device", params, placement)
        self.projector_dtype = self._get_dtype("projector_bits", params, self.projector_device, placement)
        folder = loaded_model.model_folder()
        self.vision_source = weights.vision_source(spec, loaded_model.config_dict(), params["vision_tower"])
        logger.info(f"{spec.name}: CLIP from {self.vision_source} ({self.vision_dtype}, {self.vision_device})")
        self.vision_tower, self.image_processor = weights.load_vision_tower(
            spec, self.vision_source, self.vision_dtype, self.vision_device)
        state, self.projector_source = weights.load_projector_state(spec, folder, params["projector_path"])
        # The dtype goes onto the weights, not only the inputs (the original kept fp32 weights: #4644).
        self.projector = build_projector(spec, state).to(self.projector_device, self.projector_dtype).eval()
        self._check_shapes()
        vision = self.vision_tower.config
        self.tokens_per_image = (vision.image_size // vision.patch_size) ** 2
        self.pad_fill = tuple(int(x * 255) for x in self.image_processor.image_mean)
        self.placeholder_id = self._resolve_placeholder_id()

    def _check_shapes(self) -> None:
        layers = linear_layers(self.projector)
        vision_width = self.vision_tower.config.hidden_size
        lm_width = loaded_model.input_embedding().embedding_dim
        if layers[0].in_features != vision_width:
            raise ValueError(f"The '{self.spec.name}' projector takes {layers[0].in_features}-wide features, but the "
                             f"vision tower at {self.vision_source} gives {vision_width}: the tower does not match it.")
        if layers[-1].out_features != lm_width:
            expected = f" (the published release: {self.spec.model_hidden_size})" if self.spec.model_hidden_size else ""
            raise ValueError(f"The '{self.spec.name}' projector gives {layers[-1].out_features}-wide embeddings{expected}, "
                             f"but the loaded model's are {lm_width}: pick the pipeline for this model's size.")

    def _resolve_placeholder_id(self) -> int:
        # The loaded tokenizer knows its own `<im_patch>` id; the spec's id is text-generation-webui's.
        tokenizer = shared.tokenizer
        if tokenizer is not None and self.spec.placeholder_token in tokenizer.get_vocab():
            return int(tokenizer.convert_tokens_to_ids(self.spec.placeholder_token))
        return self.spec.placeholder_id

    # -- AbstractMultimodalPipeline -------------------------------------------------------------

    def name(self) -> str:
        return self.spec.name

    def image_start(self) -> str:
        return self.spec.image_start

    def image_end(self) -> str:
        return self.spec.image_end

    def placeholder_token_id(self) -> int:
        return self.placeholder_id

    def num_image_embeds(self) -> int:
        return self.tokens_per_image

    @staticmethod
    def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
        return loaded_model.embed_tokens(input_ids)

    def placeholder_embeddings(self) -> torch.Tensor:
        """`(tokens_per_image, hidden)`: the placeholder token's embedding repeated."""
        ids = torch.full((self.tokens_per_image,), self.placeholder_id, dtype=torch.long)
        return loaded_model.embed_tokens(ids)

    def preprocess(self, images: List[Image.Image]) -> torch.Tensor:
        """`(num_images, 3, size, size)` pixel values in the tower's dtype, on its device."""
        images = [image.convert("RGB") for image in images]
        if self.spec.pad_to_square:
            images = [expand_to_square(image, self.pad_fill) for image in images]
        pixels = self.image_processor(images, return_tensors="pt")["pixel_values"]
        return pixels.to(self.vision_device, self.vision_dtype)

    def embed_images(self, images: List[Image.Image]) -> torch.Tensor:
        """`(num_images, tokens_per_image, lm_hidden)` from one batched forward of tower and projector."""
        if not images:
            raise ValueError("embed_images needs at least one image, got 0")
        pixels = self.preprocess(images)
        with torch.inference_mode():
            hidden = self.vision_tower(pixels, output_hidden_states=True).hidden_states[self.spec.feature_layer]
            features = hidden[:, 1:]  # (num_images, tokens_per_image, vision_hidden): CLS dropped
            embeds = self.projector(features.to(self.projector_device, self.projector_dtype))
        return embeds.to(*loaded_model.placement())

    # -- Optional capabilities ------------------------------------------------------------------

    def preferred_image_size(self):
        # Padded to a square, the tower sees the whole image at its size; centre-cropping pipelines
        # resize the short side, which a longest-side cap cannot express.
        return self.vision_tower.config.image_size if self.spec.pad_to_square else None

    def cache_key(self) -> str:
        return (f"{self.spec.name}|tower={self.vision_source}|projector={self.projector_source}"
                f"|vision={self.vision_dtype}@{self.vision_device}|proj={self.projector_dtype}@{self.projector_device}")
