"""The contract every multimodal pipeline implements (built-in and third-party alike).

The abstract methods are exactly those of text-generation-webui's original extension, so pipeline
modules written for it (MiniGPT-4, InstructBLIP, VisualCLA, ...) load unchanged. Newer capabilities
are ordinary methods with defaults: an extra abstract method would stop existing classes from
instantiating.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List, Optional

import torch
from PIL import Image


class AbstractMultimodalPipeline(ABC):
    @staticmethod
    @abstractmethod
    def name() -> str:
        'name of the pipeline, should be same as in --multimodal-pipeline'
        pass

    @staticmethod
    @abstractmethod
    def image_start() -> Optional[str]:
        'return image start string, string representation of image start token, or None if not applicable'
        pass

    @staticmethod
    @abstractmethod
    def image_end() -> Optional[str]:
        'return image end string, string representation of image end token, or None if not applicable'
        pass

    @staticmethod
    @abstractmethod
    def placeholder_token_id() -> int:
        'return placeholder token id'
        pass

    @staticmethod
    @abstractmethod
    def num_image_embeds() -> int:
        'return the number of embeds used by a single image (for example: 256 for LLaVA)'
        pass

    @abstractmethod
    def embed_images(self, images: List[Image.Image]) -> torch.Tensor:
        'forward the images through vision pipeline, and return their embeddings'
        pass

    @staticmethod
    @abstractmethod
    def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
        'embed tokens, the exact function varies by LLM, for LLaMA it is `shared.model.model.embed_tokens`'
        pass

    @staticmethod
    @abstractmethod
    def placeholder_embeddings() -> torch.Tensor:
        'get placeholder embeddings if there are multiple images, and `add_all_images_to_prompt` is False'
        pass

    # -- Optional capabilities (ordinary methods with defaults) ---------------------------------

    def num_image_embeds_for(self, image: Image.Image) -> int:
        """Tokens this particular image takes (LLaVA-NeXT varies with the image size)."""
        return self.num_image_embeds()

    def max_images_per_prompt(self) -> Optional[int]:
        """The most images one prompt may hold, or None for no limit of the pipeline's own."""
        return None

    def preferred_image_size(self) -> Optional[int]:
        """The longest side worth storing in history (larger images are downscaled), or None."""
        return None

    def cache_key(self) -> str:
        """Everything besides the image bytes that changes `embed_images`' result (for the embedding cache)."""
        return self.name()

    # -- Helpers for subclasses -----------------------------------------------------------------

    def _get_device(self, setting_name: str, params: dict):
        if params[setting_name] is None:
            if torch.cuda.is_available():
                return torch.device('cuda:0')
            if hasattr(torch, 'xpu') and torch.xpu.is_available():
                return torch.device('xpu:0')
            return torch.device('cpu')
        return torch.device(params[setting_name])

    def _get_dtype(self, setting_name: str, params: dict):
        value = params[setting_name]
        if value in (32, '32', 'fp32', 'float32'):
            return torch.float32
        if value in (16, '16', 'fp16', 'float16'):
            return torch.float16
        if value in ('bf16', 'bfloat16'):
            return torch.bfloat16
        raise ValueError(f"{setting_name}={value!r}: expected 32, 16 or 'bf16'")
