"""OpenAI messages -> the chat turn's input: a system message, the earlier turns, the new user message.

A message's `content` is a string or a list of parts (`{"type": "text", "text": ...}`,
`{"type": "image_url", "image_url": {"url": ...}}`); text-generation-webui's legacy message-level
`"image_url"` field works too. A user message is its text parts, one per line, and its pictures'
bytes (fetched or decoded here); the pictures then go the way the UI's uploads go
(`state['message_images']`, taken by an extension's `chat_input_modifier`): where the text says
`<image>`, else before the text. Consecutive messages of one role merge; a conversation ending with
an assistant message asks the model to continue that message. Mistakes raise APIError(400).
This module does not decode images or build prompts.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from modules.api.config import APIConfig
from modules.api.errors import APIError
from modules.api.image_fetch import fetch_image_bytes

SYSTEM_ROLES = ("system", "developer")
ROLES = (*SYSTEM_ROLES, "user", "assistant")


@dataclass
class ImageRef:
    url: str


Piece = str | ImageRef


@dataclass
class Message:
    """A user or assistant message's text, and a user message's pictures (bytes, in order)."""
    text: str = ""
    images: list[bytes] = field(default_factory=list)


@dataclass
class ChatInput:
    system_message: str
    turns: list[tuple[str, list[bytes], str]]  # (user text, its pictures, assistant text): before the reply
    user_input: Message  # empty when continuing the last assistant message
    continue_last: bool


async def chat_input(messages: list[dict[str, Any]], config: APIConfig) -> ChatInput:
    parsed = [(role_of(m, i), pieces_of(m, i)) for i, m in enumerate(messages)]
    refs = [p for _, pieces in parsed for p in pieces if isinstance(p, ImageRef)]
    if len(refs) > config.max_images_per_request:
        raise APIError(400, f"The request holds {len(refs)} images; at most {config.max_images_per_request} are "
                            f"accepted in one request", param="messages", code="too_many_images")
    data = await asyncio.gather(*(fetch_image_bytes(ref.url, config) for ref in refs)) if refs else []
    data_of = {id(ref): d for ref, d in zip(refs, data)}
    return to_chat_input([(role, Message("\n".join(p for p in pieces if isinstance(p, str)),
                                         [data_of[id(p)] for p in pieces if isinstance(p, ImageRef)]))
                          for role, pieces in parsed])


def role_of(message: dict[str, Any], index: int) -> str:
    role = message.get("role")
    if role not in ROLES:
        # A tool's result answers a tool call, which this host never makes: a request's `tools` are ignored.
        why = " (the host calls no tools: a request's tools are ignored)" if role in ("tool", "function") else ""
        raise APIError(400, f"messages[{index}]: unsupported role {role!r}{why}; expected one of {', '.join(ROLES)}",
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


def to_chat_input(messages: list[tuple[str, Message]]) -> ChatInput:
    system = "\n\n".join(m.text for role, m in messages if role in SYSTEM_ROLES and m.text)
    turns: list[list] = []  # [user Message, assistant text]
    pending_user: Message | None = None
    for role, message in merged_runs([(role, m) for role, m in messages if role not in SYSTEM_ROLES]):
        if role == "user":
            pending_user = message
        else:  # an assistant message answers the user's before it, or opens the chat
            turns.append([pending_user or Message(), message.text])
            pending_user = None
    done = [(user.text, user.images, bot) for user, bot in turns]
    if pending_user is not None:
        return ChatInput(system, done, pending_user, continue_last=False)
    if not turns:
        raise APIError(400, "messages holds no user or assistant message: add {\"role\": \"user\", \"content\": ...}",
                       param="messages")
    return ChatInput(system, done, Message(), continue_last=True)


def merged_runs(messages: list[tuple[str, Message]]) -> list[tuple[str, Message]]:
    """Consecutive messages of one role as one: their texts a line apart, their pictures in order
    (joined once: merging them pairwise copied the text so far at each message)."""
    runs = []
    for role, run in itertools.groupby(messages, key=lambda item: item[0]):
        run = [message for _, message in run]
        runs.append((role, Message("\n".join(m.text for m in run), [image for m in run for image in m.images])))
    return runs
