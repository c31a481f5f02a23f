"""OpenAI messages -> the host's chat input: a system message, [user, assistant] turns, the new user text.

A message's `content` is a string or a list of parts (`{"type": "text", "text": ...}`,
`{"type": "image_url", "image_url": {"url": ...}}`); text-generation-webui's legacy message-level
`"image_url"` field works too. Images become `<img>` tags (see `image_tags`), written where the
part stands, one part per line. Consecutive messages of one role merge; a conversation ending with
an assistant message asks the model to continue that message. Mistakes raise APIError(400).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from modules.api.config import APIConfig
from modules.api.errors import APIError
from modules.api.image_tags import url_to_tag

SYSTEM_ROLES = ("system", "developer")
ROLES = (*SYSTEM_ROLES, "user", "assistant")


@dataclass
class ImageRef:
    url: str


Piece = str | ImageRef


@dataclass
class ChatInput:
    system_message: str
    turns: list[list[str]]  # [[user, assistant], ...]: the history before the reply
    user_input: str  # "" when continuing the last assistant message
    continue_last: bool

    @property
    def history(self) -> dict:
        return {"internal": self.turns, "visible": [list(t) for t in self.turns]}


async def chat_input(messages: list[dict[str, Any]], config: APIConfig) -> ChatInput:
    parsed = [(role_of(m, i), pieces_of(m, i)) for i, m in enumerate(messages)]
    refs = [p for _, pieces in parsed for p in pieces if isinstance(p, ImageRef)]
    if len(refs) > config.max_images_per_request:
        raise APIError(400, f"The request holds {len(refs)} images; at most {config.max_images_per_request} are "
                            f"accepted in one request", param="messages", code="too_many_images")
    tags = await asyncio.gather(*(url_to_tag(ref.url, config) for ref in refs)) if refs else []
    tag_of = {id(ref): tag for ref, tag in zip(refs, tags)}
    texts = [(role, "\n".join(tag_of[id(p)] if isinstance(p, ImageRef) else p for p in pieces))
             for role, pieces in parsed]
    return to_chat_input(texts)


def role_of(message: dict[str, Any], index: int) -> str:
    role = message.get("role")
    if role not in ROLES:
        raise APIError(400, f"messages[{index}]: unsupported role {role!r}; expected one of {', '.join(ROLES)}",
                       param=f"messages.{index}.role")
    return role


def pieces_of(message: dict[str, Any], index: int) -> list[Piece]:
    """The message's text and images in order. Images only in user messages."""
    where = f"messages[{index}]"
    content = message.get("content")
    pieces: list[Piece] = []
    legacy = message.get("image_url")
    if legacy is not None:
        pieces.append(ImageRef(image_url_of({"image_url": legacy}, f"{where}.image_url")))
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        pieces.extend(part_piece(part, f"{where}.content[{i}]") for i, part in enumerate(content))
    elif content is None:
        if message["role"] != "assistant" and legacy is None:
            raise APIError(400, f"{where}: a {message['role']} message needs a 'content'", param=f"messages.{index}")
    else:
        raise APIError(400, f"{where}.content must be a string or a list of parts, got {type(content).__name__}",
                       param=f"messages.{index}.content")
    if message["role"] != "user" and any(isinstance(p, ImageRef) for p in pieces):
        raise APIError(400, f"{where}: images are accepted in user messages only, not in {message['role']} messages",
                       param=f"messages.{index}")
    return pieces


def part_piece(part: Any, where: str) -> Piece:
    if not isinstance(part, dict):
        raise APIError(400, f"{where} must be an object like {{\"type\": \"text\", \"text\": ...}}, "
                            f"got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}: a text part needs a string 'text'")
        return part["text"]
    if kind == "image_url":
        return ImageRef(image_url_of(part, where))
    raise APIError(400, f"{where}: unsupported content part type {kind!r}; supported: 'text', 'image_url'")


def image_url_of(part: dict, where: str) -> str:
    """`{"image_url": {"url": ...}}`, or the bare-string form some clients send."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{where}: an image_url part needs {{\"image_url\": {{\"url\": \"data:... or https://...\"}}}}")
    return url


def to_chat_input(texts: list[tuple[str, str]]) -> ChatInput:
    system = "\n\n".join(text for role, text in texts if role in SYSTEM_ROLES and text)
    turns: list[list[str]] = []
    pending_user: str | None = None
    for role, text in texts:
        if role == "user":
            pending_user = text if pending_user is None else f"{pending_user}\n{text}"
        elif role == "assistant":
            if pending_user is None and turns:
                turns[-1][1] = f"{turns[-1][1]}\n{text}"
            else:
                turns.append([pending_user or "", text])
                pending_user = None
    if pending_user is not None:
        return ChatInput(system, turns, pending_user, continue_last=False)
    if not turns:
        raise APIError(400, "messages holds no user or assistant message: add {\"role\": \"user\", \"content\": ...}",
                       param="messages")
    return ChatInput(system, turns, "", continue_last=True)
