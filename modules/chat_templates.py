"""Rendering chat messages with the model's chat template, the way the model's own processor does.

Messages come in as `{"role", "content": str}`, a user message's pictures as the image tags an
extension wrote into its text. A template that takes structured content (`[{"type": "text"}, {"type":
"image"}]`, what Hugging Face's processors render) gets it: some templates drop string content
silently (llava-hf's own renders only typed parts), others write an image part in ways a string
cannot say (markers around it, where it goes in the turn, the spacing before it). Each tag becomes an
image part (the newline the UI and the API write after a picture separates parts); in the rendered
text, each image part's placeholder (`image_placeholder` hook, e.g. `<|image_pad|>`) becomes that
picture's tag again, so the extension finds the picture where the template put it.
String content is rendered as is when the template takes only strings, when no extension names a
placeholder, or when the placeholders in the rendered text do not pair with the pictures one to one
(a placeholder typed as text, say).
This module knows no model family: the template decides, the hooks name the tags and placeholders.
"""
from __future__ import annotations

import re
from typing import Optional

from modules import shared
from modules.extensions import apply_extensions
from modules.logging_colors import logger

PROBE = "probe-7e3d91"
_takes_parts: dict[str, bool] = {}  # chat template -> whether it renders structured content


def render(messages: list[dict], **kwargs) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)`, with structured content where it fits."""
    tokenizer = shared.tokenizer
    if takes_structured_content(tokenizer):
        rendered = render_structured(messages, kwargs)
        if rendered is not None:
            return rendered
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def takes_structured_content(tokenizer) -> bool:
    """Does the template render `[{"type": "text", "text": ...}]` content as its text? (Probed once per template.)"""
    template = tokenizer.chat_template
    if template not in _takes_parts:
        probe = [{"role": "user", "content": [{"type": "text", "text": PROBE}]}]
        try:
            rendered = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        except Exception:  # a template written for strings only may fail on lists in any way
            rendered = ""
        _takes_parts[template] = PROBE in rendered and "'type'" not in rendered
    return _takes_parts[template]


def render_structured(messages: list[dict], kwargs: dict) -> Optional[str]:
    pattern: Optional[re.Pattern] = apply_extensions("image_tag_pattern")
    tags: list[str] = []
    structured = [{"role": m["role"], "content": content_parts(m["content"], pattern, tags)} for m in messages]
    placeholder = apply_extensions("image_placeholder") if tags else None
    if tags and not placeholder:
        return None
    rendered = shared.tokenizer.apply_chat_template(structured, tokenize=False, **kwargs)
    if not tags:
        return rendered
    pieces = rendered.split(placeholder)
    if len(pieces) != len(tags) + 1:
        logger.debug(f"Chat template: {len(pieces) - 1} '{placeholder}' for {len(tags)} pictures; rendering strings")
        return None
    return "".join(piece + tag for piece, tag in zip(pieces, tags)) + pieces[-1]


def content_parts(content: str, pattern: Optional[re.Pattern], tags: list[str]) -> list[dict]:
    """A message's text as typed parts: each image tag an image part (its tag appended to `tags`)."""
    parts: list[dict] = []
    position = 0
    for match in pattern.finditer(content) if pattern is not None else ():
        if match.start() > position:
            parts.append({"type": "text", "text": content[position:match.start()]})
        parts.append({"type": "image"})
        tags.append(match.group(0))
        position = match.end() + (1 if content.startswith("\n", match.end()) else 0)
    if position < len(content) or not parts:
        parts.append({"type": "text", "text": content[position:]})
    return parts
