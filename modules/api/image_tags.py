"""Image URLs -> the `<img src="data:image/jpeg;base64,...">` tags the UI writes into prompts.

Conversion is one call into the multimodal extension, `image_bytes_to_tag(data)`, which decodes any
Pillow format, caps the size for the active pipeline and re-encodes a real JPEG; the prompt then
takes the same extension path as a UI message. Without the extension loaded, images are refused.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

import anyio

from modules import extensions, shared
from modules.api.config import APIConfig
from modules.api.errors import APIError
from modules.api.image_fetch import fetch_image_bytes, shorten

EXTENSION = "multimodal"


def multimodal_script() -> ModuleType | None:
    """The loaded, enabled multimodal extension's script module, else None."""
    entry = extensions.state.get(EXTENSION)
    if not entry or not entry[0]:
        return None
    return importlib.import_module(f"extensions.{EXTENSION}.script")


def tag_converter() -> Callable[[bytes], str]:
    """`image_bytes_to_tag`, or a 400 saying that this model cannot take images."""
    script = multimodal_script()
    if script is None:
        raise APIError(400, f"The loaded model ({shared.model_name}) cannot take images: the multimodal extension "
                            f"is not loaded. Load an image-text model (e.g. a llava-hf folder) or start with "
                            f"--multimodal-pipeline NAME.", code="images_not_supported")
    return script.image_bytes_to_tag


async def url_to_tag(url: str, config: APIConfig) -> str:
    """Fetch or decode `url`, then let the extension turn the bytes into a tag (400 when undecodable)."""
    convert = tag_converter()  # before fetching: no network traffic for a request we would refuse
    data = await fetch_image_bytes(url, config)
    try:
        # Decoding and JPEG encoding are CPU work: keep them off the event loop.
        return await anyio.to_thread.run_sync(convert, data)
    except ValueError as error:  # ImageDecodeError and other caller mistakes
        raise APIError(400, f"Cannot use the image {shorten(url)}: {error}", code="invalid_image") from None


def prompt_has_image_tags(prompt: str) -> bool:
    if "<img" not in prompt:  # cheap check first: the codec is part of the extension
        return False
    codec = importlib.import_module(f"extensions.{EXTENSION}.image_codec")
    return codec.IMAGE_TAG_RE.search(prompt) is not None


def require_image_support_for(prompt: str) -> None:
    """A completions prompt with `<img>` tags needs the extension, else the tags would reach the model as text."""
    if prompt_has_image_tags(prompt):
        tag_converter()

