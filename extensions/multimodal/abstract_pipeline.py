"""The contract every multimodal pipeline implements (built-in and third-party alike).

The abstract methods are exactly those of text-generation-webui's original extension, so pipeline
modules written for it (MiniGPT-4, InstructBLIP, VisualCLA, ...) load unchanged. Newer capabilities
are ordinary methods with defaults: an extra abstract method would stop existing classes from
instantiating.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch
from PIL import Image


@dataclass
class ImageLayout:
    """One image's share of the prompt's ids, as the model's own processor writes it."""
    ids: torch.Tensor  # (n,) int64: everything the image becomes; `placeholder_token_id()` where its features go
    info: dict = field(default_factory=dict)  # per-image facts `generate_kwargs` needs (Qwen: the image's grid)
    # What the pipeline made of the picture to lay it out (its processor's tensors), or None: the embedder
    # keeps it, bounded, with the decoded picture and gives it back as `embed_images(images, prepared=[...])`,
    # so a new picture is not decoded and processed a second time when it is embedded.
    prepared: Any = None


def feature_rows(features: torch.Tensor) -> torch.Tensor:
    """The `(rows, hidden)` an image's features put at its placeholder positions.

    `embed_images` gives per image `(rows, hidden)`, or `(rows, 1 + k, hidden)` for a model that also
    reads k more rows per image position inside its language model (Qwen3-VL's DeepStack: one per
    early layer; Mllama: the states its cross-attention reads, at its one `<|image|>` position); then
    `[:, 0]` are the rows and the rest reach the model through `generate_kwargs`.
    """
    return features[:, 0] if features.dim() == 3 else features


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
        """The longest side worth keeping, or None (1024). Read only by the `jpeg` history format, which
        downscales larger pictures to it; the default `exact` format stores every picture as sent."""
        return None

    def cache_key(self) -> str:
        """Everything besides the image bytes that changes `embed_images`' result (for the embedding cache)."""
        return self.name()

    def image_layout(self, image: Image.Image) -> ImageLayout:
        """The ids this image becomes: by default `num_image_embeds_for(image)` placeholder ids. Pipelines
        whose processor writes markers, row breaks or tile tokens among the image tokens return them all;
        features go where the ids are `placeholder_token_id()` (`embed_images` returns that many rows)."""
        return ImageLayout(torch.full((self.num_image_embeds_for(image),), int(self.placeholder_token_id()),
                                      dtype=torch.int64))

    def layout_depends_on_count(self) -> bool:
        """Whether a picture's ids and rows change once its prompt holds several (LLaVA-OneVision); then
        `image_layout` and `embed_images` take `several=True` for such prompts, cached apart."""
        return False

    def generate_kwargs(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor, layouts: List[ImageLayout],
                        features: List[torch.Tensor]) -> Optional[Callable[[int, object], dict]]:
        """How the model takes this prompt, when stitched `inputs_embeds` alone are not enough; None when they are.

        In: the prompt's ids `(1, n)` (the real placeholder ids), its stitched embeddings `(1, n, hidden)`,
        and per embedded image, in order, its layout and features (as `embed_images` gave them: see
        `feature_rows`). Out: a function of how many leading tokens a prefix KV cache already holds and
        of that cache (None without one), giving `generate()` keyword arguments (the host adds the
        cache to them): e.g. 3-D rotary `position_ids` (Qwen2-VL), `input_ids` with the precomputed
        features and `token_type_ids` (Gemma 3), or a cache the function prefilled itself (Mllama's
        cross-attention). Hosts without this hook (text-generation-webui) use the embeddings.
        """
        return None

    def prompt_text(self, prompt: str) -> str:
        """The prompt (image tags included) as the model's processor rewrites its text before tokenizing."""
        return prompt

    def chat_template_placeholder(self) -> Optional[str]:
        """The text the model's chat template writes for an image part (e.g. Qwen's
        `<|vision_start|><|image_pad|><|vision_end|>`), or None; an image's tag stands for all of it.

        A host that renders chat messages with structured content puts each image's tag there, so the
        template formats images as the model was trained (their place in the turn, the text around them).
        """
        return None

    def budget_knob(self) -> Optional[str]:
        """What a picture budget (`image_budget.Budget`) changes, e.g. "pixels per picture"; None when every
        picture costs the same. A pipeline that names one takes `budget=` in `image_layout` and
        `embed_images`, and lays out and embeds each picture as that budget allows."""
        return None

    def embeds_all_images(self) -> bool:
        """Whether every image in the prompt is embedded when `add_all_images_to_prompt` is unset (None);
        False: only the newest (older ones get `placeholder_embeddings()`), as the original extension did."""
        return False

    def features_exact_here(self) -> bool:
        """Whether `embed_images` and `generate_kwargs` give the model's own tokens with the installed
        libraries; where not, a host that takes no routes (text-generation-webui) uses `processor_inputs`."""
        return True

    def processor_kwargs(self, budget) -> dict:
        """The model's processor's own keyword arguments for a picture budget (a remote engine passes them to
        its processor); none by default."""
        return {}

    def processor_inputs(self, prompt: str, add_bos: bool, max_pixels: int, budget=None):
        """The model's own processor inputs for `prompt` (tags standing for image parts) for
        `model.generate(**inputs)`; needed only where `features_exact_here()` is False."""
        raise NotImplementedError(f"The pipeline '{self.name()}' has no processor route: its features are exact "
                                  f"here (features_exact_here), so the embedder's inputs serve every host.")

    # -- Helpers for subclasses -----------------------------------------------------------------

    def _get_device(self, setting_name: str, params: dict,
                    placement: Optional[tuple[torch.device, torch.dtype]] = None) -> torch.device:
        """A `*_device` param as a device; None: the language model's own, `placement[0]` (the original
        extension picked cuda:0 whenever CUDA existed, even for a model run on the CPU with --cpu)."""
        if params.get(setting_name) is None:
            return (placement or host_model_placement())[0]
        return torch.device(params[setting_name])

    def _get_dtype(self, setting_name: str, params: dict, device: Optional[torch.device] = None,
                   placement: Optional[tuple[torch.device, torch.dtype]] = None) -> torch.dtype:
        """A `*_bits` param as a dtype; None: the language model's own, `placement[1]`. 16 on a CPU
        `device` means bfloat16: CPUs have no fast float16."""
        value = params.get(setting_name)
        if value is None:
            return (placement or host_model_placement())[1]
        if value in (32, '32', 'fp32', 'float32'):
            return torch.float32
        if value in (16, '16', 'fp16', 'float16'):
            return torch.bfloat16 if device is not None and torch.device(device).type == "cpu" else torch.float16
        if value in ('bf16', 'bfloat16'):
            return torch.bfloat16
        raise ValueError(f"{setting_name}={value!r}: expected 32, 16 or 'bf16'")


def host_model_placement() -> tuple[torch.device, torch.dtype]:
    """The host's loaded model's input-embedding device and dtype (the CPU and float32 before one is
    loaded), for pipelines written for the original extension, which call `_get_device(name, params)`
    with no placement: read from `modules.shared`, the one host name every host has."""
    from modules import shared

    if shared.model is None:
        return torch.device("cpu"), torch.float32
    weight = shared.model.get_input_embeddings().weight
    return weight.device, weight.dtype


def overrides(pipeline, method_name: str) -> bool:
    """Whether `pipeline` implements an optional capability itself, not this class's default.

    The layout defaults only restate `num_image_embeds()` and `generate_kwargs`' gives None: the
    prompt encoder and the embedder skip work (decoding a picture to lay it out, a route) for
    pipelines that keep them. Compared by name: tests reload modules.
    """
    method = getattr(type(pipeline), method_name, None)
    default = getattr(AbstractMultimodalPipeline, method_name)
    return method is not None and method.__qualname__ != default.__qualname__
