"""Chat templates that take a message's content as a list of parts, in a host that passes strings.

Hugging Face's processors render a conversation whose content is a list of parts
(`[{"type": "image"}, {"type": "text", "text": ...}]`). text-generation-webui renders every message
with string content, a picture as a `<__media__>` marker (attach button, API) or as the history's
`<img>` tag (the "Send a picture" box). The hub's templates of llava-hf, LLaVA-NeXT, LLaVA-OneVision,
Idefics3 and SmolVLM read content only as parts: given a string they write the role markers alone
(`USER: ASSISTANT:`), or fail (LLaVA-NeXT reads `message['content'][0]['text']`).

`PartsTemplate` is the class the host's Jinja environment compiles templates into once
`use_parts_templates()` ran. A template that writes something for an image part (what one user
message with two image parts renders to, less the same with one, e.g. "<image>\\n") is
rendered with every message's content as parts, as Hugging Face gets the conversation: the text
between pictures as text parts, stripped where it meets a picture (the host writes "\\n\\n" after
a message's pictures, which belongs to no part), and each picture as an image part. In the rendered
text, each image text the template wrote becomes that picture's marker or tag again, so the
extension finds every picture where the template put it; the processor route writes the template's
image text for it again (`hf_auto/processor_route.image_text`).
A template that writes nothing for an image part but renders text parts, not strings, gets text
parts with the markers left in the text. Any other template, and a render whose image texts do not
pair one to one with the pictures (a user who typed the image text), gets strings, as before.
This module knows no model family and no tensors.
"""
from __future__ import annotations

import importlib
import re
from typing import Optional

from jinja2 import Template, TemplateError

from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
from extensions.multimodal.tgw.native_media import MEDIA_MARKER
from extensions.multimodal.pipelines.hf_auto.image_tokens import PROBE, template_image_text

PICTURE_RE = re.compile(f"{re.escape(MEDIA_MARKER)}|{IMAGE_TAG_RE.pattern}")
TEXT_PART = {"type": "text", "text": PROBE}
STRINGS, TEXT_PARTS = "strings", "text parts"  # how a template is rendered when it writes no image text


class PartsTemplate(Template):
    """A compiled chat template that gets its messages' content as parts where it takes parts."""

    _image_text: Optional[str] = None  # probed on the first render: the text an image part renders to, or a mode

    def render(self, *args, **kwargs) -> str:
        messages = kwargs.get("messages")
        if not isinstance(messages, list) or not messages:
            return super().render(*args, **kwargs)
        if self._image_text is None:
            self._image_text = probe_image_text(super().render, kwargs)
        if self._image_text == STRINGS:
            return super().render(*args, **kwargs)
        pictures: list[str] = []
        keep_pictures = self._image_text == TEXT_PARTS
        as_parts = [with_parts(message, pictures, keep_pictures) for message in messages]
        rendered = super().render(*args, **{**kwargs, "messages": as_parts})
        if keep_pictures:
            return rendered
        pieces = rendered.split(self._image_text)
        if len(pieces) != len(pictures) + 1:
            return super().render(*args, **kwargs)
        return "".join(piece + picture for piece, picture in zip(pieces, pictures)) + pieces[-1]


def probe_image_text(render, kwargs: dict) -> str:
    """What an image part renders to; `TEXT_PARTS` for a template that writes none but takes only
    parts; `STRINGS` for one that takes strings (or cannot render the probe)."""
    def render_user(content) -> str:
        return render(**{**kwargs, "messages": [{"role": "user", "content": content}], "add_generation_prompt": True})

    try:
        written = template_image_text(render_user)
        takes_text_parts, takes_strings = PROBE in render_user([TEXT_PART]), PROBE in render_user(PROBE)
    except (TemplateError, TypeError, ValueError, LookupError):
        return STRINGS  # a template written for strings may fail on parts in any of these ways
    if not takes_text_parts:
        return STRINGS
    return written if written.strip() else (STRINGS if takes_strings else TEXT_PARTS)


def with_parts(message: dict, pictures: list[str], keep_pictures: bool) -> dict:
    """`message` with its string content as parts; each picture's marker or tag appended to `pictures`."""
    content = message.get("content")
    if not isinstance(content, str):
        return message
    return {**message, "content": [{"type": "text", "text": content}] if keep_pictures else
            content_parts(content, pictures)}


def content_parts(content: str, pictures: list[str]) -> list[dict]:
    """Text and image parts in the order of `content`; text that meets a picture is stripped there."""
    parts: list[dict] = []
    position = 0
    for match in PICTURE_RE.finditer(content):
        text = content[position:match.start()]
        text = text.strip() if parts else text.rstrip()  # a message's own leading text keeps its start
        if text:
            parts.append({"type": "text", "text": text})
        parts.append({"type": "image"})
        pictures.append(match.group(0))
        position = match.end()
    rest = content[position:].lstrip() if parts else content
    if rest or not parts:
        parts.append({"type": "text", "text": rest})
    return parts


def use_parts_templates() -> bool:
    """Compile the host's chat templates as `PartsTemplate`s, where its Jinja environment is
    text-generation-webui's (`modules.chat.jinja_env`); True when this changed it."""
    try:
        chat = importlib.import_module("modules.chat")
    except ImportError:
        return False
    environment = getattr(chat, "jinja_env", None)  # this repository's host renders through transformers
    if environment is None or issubclass(environment.template_class, PartsTemplate):
        return False
    environment.template_class = type("PartsTemplate", (PartsTemplate, environment.template_class), {})
    cache = getattr(chat, "_template_cache", None)  # templates compiled before, as the old class
    if isinstance(cache, dict):
        cache.clear()
    return True
