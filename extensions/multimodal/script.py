"""The multimodal extension: lets a local LLaVA-style model see the images in a chat.

Hooks, in the order the host calls them:
- `setup()`: loads the pipeline (named by --multimodal-pipeline, else recognised from the model);
  raises a RuntimeError listing the available pipelines when none fits. Runs without a UI.
- `ui()`: the image input (extensions/multimodal/ui.py), built inside the host's Gradio layout.
- `chat_input_modifier(text, visible_text, state)`: puts the images sent with this message
  (`state['multimodal_images']`, or `input_hijack`) into the text as `<img>` tags.
- `custom_tokenized_length(prompt)`: prompt length in tokens, image tokens included.
- `tokenizer_modifier(state, prompt, input_ids, input_embeds)`: for a prompt with images,
  `(prompt, input_ids [1, n] int64, inputs_embeds [1, n, hidden])` on the model's device and dtype;
  other prompts come back unchanged.
- `logits_processor_modifier(processor_list, input_ids)`: in text-generation-webui, adds the ban on
  image placeholder tokens (extensions/multimodal/placeholder_ban.py). This repository's host
  constructs the batch-level `logits_processors` after `setup()` instead, and this hook adds nothing.
`image_bytes_to_tag(data)` turns image bytes into the history's tag (the API uses it).
Settings `multimodal-<key>` override `params[key]` before `setup()`.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

import torch
from PIL import Image

from extensions.multimodal.image_codec import (DEFAULT_MAX_PIXELS, IMAGE_TAG_RE, ImageDecodeError, bytes_to_tag,
                                               image_to_tag, ordinal)
from extensions.multimodal.multimodal_embedder import MultimodalEmbedder
from extensions.multimodal.placeholder_ban import HFPlaceholderBan, placeholder_ids
from modules import shared
from modules.logging_colors import logger
from modules.models import model_device

try:
    from extensions.multimodal.placeholder_ban_batch import PlaceholderBan
except ImportError as error:  # a host without batch-level processors (text-generation-webui)
    if error.name != "modules.logits_processors":
        raise
    PlaceholderBan = None

params = {
    "add_all_images_to_prompt": False,
    # device to run the vision encoder on (None: the language model's device)
    "vision_device": None,
    # bits to load the vision encoder in: 32, 16 or 'bf16'
    "vision_bits": 32,
    # device to run the multimodal projector on
    "projector_device": None,
    # bits to load the projector in: 32, 16 or 'bf16'
    "projector_bits": 32,
    # images larger than this many pixels are rejected before they are decoded
    "max_image_pixels": DEFAULT_MAX_PIXELS,
    # the most images embedded in one prompt (None: only the pipeline's own limit)
    "max_images_per_prompt": None,
    # image embeddings kept between turns, in MiB (0 turns the cache off)
    "embedding_cache_mb": 256,
    # more folders holding pipeline modules, searched after extensions/multimodal/pipelines/
    "pipeline_dirs": [],
    # original LLaVA checkpoints: a local CLIP folder instead of the hub repo the release used
    "vision_tower": None,
    # original LLaVA checkpoints: a local mm_projector .bin/.safetensors instead of the model folder's
    "projector_path": None,
}

# text-generation-webui's way for a UI to hand images to the next chat message:
# {'state': True, 'value': fn(text, visible_text) -> (text, visible_text)} applies once.
input_hijack = {"state": False, "value": ["", ""]}

multimodal_embedder: Optional[MultimodalEmbedder] = None

# Longest side stored in history when the pipeline states no preference (keeps histories small).
DEFAULT_HISTORY_MAX_SIDE = 1024
IMAGE_PLACEHOLDER = "<image>"

# Batch-level logits processor classes; the host constructs them after setup() (other hosts ignore this).
logits_processors = [PlaceholderBan] if PlaceholderBan is not None else []


def setup() -> None:
    global multimodal_embedder
    multimodal_embedder = MultimodalEmbedder(params)


def ui() -> None:
    from extensions.multimodal import ui as multimodal_ui

    multimodal_ui.create_ui(params)


def embedder() -> MultimodalEmbedder:
    if multimodal_embedder is None:
        raise RuntimeError("The multimodal extension is not set up: its setup() did not run or failed "
                           "(see the log for the pipeline error).")
    return multimodal_embedder


# -- Images into the chat ---------------------------------------------------------------------

def history_max_side() -> int:
    pipeline = multimodal_embedder.pipeline if multimodal_embedder is not None else None
    preferred = pipeline.preferred_image_size() if hasattr(pipeline, "preferred_image_size") else None
    return int(preferred) if preferred else DEFAULT_HISTORY_MAX_SIDE


def image_bytes_to_tag(data: bytes, label: str = "the image") -> str:
    """Bytes in any Pillow format -> `<img src="data:image/jpeg;base64,...">` holding a real JPEG.

    Normalised (upright RGB, transparency on white) and capped at the active pipeline's preferred
    size, never upscaled. Raises ImageDecodeError naming the cause.
    """
    max_pixels = int(params.get("max_image_pixels") or DEFAULT_MAX_PIXELS)
    return bytes_to_tag(data, max_pixels, history_max_side(), label)


def image_to_history_tag(image: Any, label: str = "the image") -> str:
    """A file path, bytes, a PIL image or a Gradio file dict -> a history tag."""
    if isinstance(image, dict) and "path" in image:
        image = image["path"]
    if isinstance(image, Image.Image):
        return image_to_tag(image, history_max_side())
    if isinstance(image, (str, Path)):
        try:
            image = Path(image).read_bytes()
        except OSError as error:
            raise ImageDecodeError(f"Cannot read {label} from {image}: {error}") from error
    if isinstance(image, (bytes, bytearray)):
        return image_bytes_to_tag(bytes(image), label)
    raise ImageDecodeError(f"Cannot read {label}: expected a file path, bytes or a PIL image, got {type(image).__name__}")


def add_images_to_message(tags: list[str], text: str, visible_text: str) -> tuple[str, str]:
    """Each `<image>` in the text takes the next tag; remaining tags go before the text."""
    text, rest = fill_placeholders(text, IMAGE_PLACEHOLDER, tags)
    visible_text, visible_rest = fill_placeholders(visible_text, html.escape(IMAGE_PLACEHOLDER), tags)
    if rest:
        text = "\n".join(rest + [text]) if text else "\n".join(rest)
    if visible_rest:
        visible_text = "\n".join(visible_rest + [visible_text]) if visible_text else "\n".join(visible_rest)
    return text, visible_text


def fill_placeholders(text: str, placeholder: str, tags: list[str]) -> tuple[str, list[str]]:
    pieces = text.split(placeholder)
    used = min(len(pieces) - 1, len(tags))
    filled = "".join(piece + tags[i] for i, piece in enumerate(pieces[:used])) + placeholder.join(pieces[used:])
    return filled, tags[used:]


def add_chat_picture(picture: Any, text: str, visible_text: str) -> tuple[str, str]:
    """text-generation-webui's helper for `input_hijack`: one picture into the next message."""
    return add_images_to_message([image_to_history_tag(picture)], text, visible_text)


def chat_input_modifier(text: str, visible_text: str, state: dict) -> tuple[str, str]:
    images = state.pop("multimodal_images", None) or []
    if images:
        tags = [image_to_history_tag(image, f"the {ordinal(i + 1)} image sent" if len(images) > 1 else "the image")
                for i, image in enumerate(images)]
        return add_images_to_message(tags, text, visible_text)
    if input_hijack["state"]:
        input_hijack["state"] = False
        value = input_hijack["value"]
        return value(text, visible_text) if callable(value) else tuple(value)
    return text, visible_text


# -- Model inputs ---------------------------------------------------------------------------

def custom_tokenized_length(prompt: str) -> int:
    return embedder().len_in_tokens(prompt)


def tokenizer_modifier(state: dict, prompt: str, input_ids: torch.Tensor, input_embeds: Optional[torch.Tensor]):
    if IMAGE_TAG_RE.search(prompt) is None:
        return prompt, input_ids, input_embeds
    current = embedder()
    prompt, ids, embeds, _ = current.forward(prompt, state, params)
    stats = current.last_stats
    logger.info(f"Multimodal: embedded {stats.images} image(s) in {stats.seconds:.2f} s ({stats.from_cache} from cache)")
    device = model_device()
    dtype = shared.model.get_input_embeddings().weight.dtype
    return prompt, ids.unsqueeze(0).to(device, torch.int64), embeds.unsqueeze(0).to(device, dtype)


def logits_processor_modifier(processor_list, input_ids):
    """text-generation-webui's hook: ban the image placeholder ids where `PlaceholderBan` cannot run."""
    if PlaceholderBan is None and multimodal_embedder is not None:
        processor_list.append(HFPlaceholderBan(placeholder_ids(multimodal_embedder.pipeline)))
    return processor_list
