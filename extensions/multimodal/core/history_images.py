"""Pictures into the chat history: the tag each is stored as, and where the tags go in a message.

A picture (a file path, bytes, a PIL image or a Gradio file dict) is stored as the history's tag
holding exactly the bytes sent (JPEG and PNG as they came, other formats as a lossless PNG), unless
the `history_image_format` param is `jpeg` (re-encoded, the longest side capped at the pipeline's
preference). Tags go into a message where it says `<image>`, the rest before its text. Raises
ImageDecodeError naming the picture and the cause. Nothing here knows tokens or models.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

from PIL import Image

from extensions.multimodal.core import notices, served_model
from extensions.multimodal.core.defaults import max_image_pixels
from extensions.multimodal.core.image_codec import ImageDecodeError, Stored, store_bytes, store_image

DEFAULT_HISTORY_MAX_SIDE = 1024  # the `jpeg` format's longest side when the pipeline states no preference
IMAGE_PLACEHOLDER = "<image>"  # where a message wants its next picture


def history_max_side() -> int:
    pipeline = served_model.current_pipeline()
    preferred = pipeline.preferred_image_size() if pipeline is not None else None  # None: no model served yet
    return int(preferred) if preferred else DEFAULT_HISTORY_MAX_SIDE


def store(picture: Any, params: dict, label: str = "the image") -> Stored:
    """`picture` -> what the history keeps of it (see the module docstring)."""
    history_format, max_side = params["history_image_format"], history_max_side()
    if isinstance(picture, dict) and "path" in picture:
        picture = picture["path"]
    if isinstance(picture, Image.Image):
        return store_image(picture, history_format, max_side)
    if isinstance(picture, (str, Path)):
        try:
            picture = Path(picture).read_bytes()
        except OSError as error:
            raise ImageDecodeError(f"Cannot read {label} from {picture}: {error}") from error
    if isinstance(picture, (bytes, bytearray)):
        return store_bytes(bytes(picture), max_image_pixels(params), label, history_format, max_side)
    raise ImageDecodeError(f"Cannot read {label}: expected a file path, bytes or a PIL image, got {type(picture).__name__}")


def history_tags(pictures: list, state: Optional[dict], params: dict, label_of=lambda i, n: "the image") -> list[str]:
    """The tags of `pictures`; when the `jpeg` history format changed any, `state['notices']` says so."""
    stored = [store(picture, params, label_of(i, len(pictures))) for i, picture in enumerate(pictures)]
    changed = sum(item.changed for item in stored)
    if changed and state is not None:
        notices.tell(state, f"{changed} picture(s) stored as JPEG (at most {history_max_side()} px) because of "
                            f"multimodal-history_image_format: jpeg; the model sees that JPEG, not the exact picture.",
                     level="info")
    return [item.tag for item in stored]


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
