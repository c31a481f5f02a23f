"""Rendering a chat whose history holds pictures without carrying their data through the template.

A history keeps each picture as the tag an extension wrote (the `image_tag_pattern` hook names its
regular expression): megabytes of base64 for a phone photo. Every turn renders the whole chat with the
model's chat template twice (with and without the bot's prefix), more often when old turns are
dropped to fit. Each render copied every tag, and for a template that takes typed parts ran the tag's
regular expression over every message, which reads the data a character at a time: with four phone
photos in the history, a text turn spent 160 ms rendering (2 AMD EPYC cores, llava-hf's own template).

So the tags are set aside before rendering (`set_aside`). Each message carries a stand-in instead: the
same tag with its data replaced by a short key. The stand-in still matches the pattern, so a template
and `chat_templates` take it for a picture. The rendered text gets the tags back in one pass
(`put_back`). A message's text with stand-ins is kept, keyed by the message's text (a history keeps
its strings from turn to turn; an API request's equal strings find them too), so each picture's tag
is searched for once, not at every render.

The prompt without its tags, which the host tokenizes before the `tokenizer` hook replaces those ids
(`text_generation.text_for_plain_ids`), is the rendered text without its stand-ins: `plain_text` gives
it for the prompts put together last, so the host does not search the whole prompt again.
In: messages `{"role", "content": str}` and the pattern; out: messages to render, then the prompt.
This module knows no template and no model.
"""
from __future__ import annotations

import itertools
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Optional

from modules.message_memo import MessageMemo

# In every stand-in's data, so no text a user sends holds a stand-in (base64 characters only).
KEY = secrets.token_hex(8)
RECENT_PROMPTS = 2  # prompts whose plain text is kept: a turn's, and one put together meanwhile


@dataclass(frozen=True)
class SetAside:
    """A message's text with a stand-in for each tag, and the tags by stand-in."""
    text: str
    tags: dict[str, str]


_numbers = itertools.count()  # each stand-in's own number: stand-ins from different messages never meet
# A live chat's messages are the history's own strings; this bounds what chats already gone leave held
# (a message's text with stand-ins is short, its tags as long as the text).
SET_ASIDE = MessageMemo(max_chars=128 * 2**20)
_recent: list[tuple[str, str]] = []  # (prompt, its plain text), newest last
_lock = threading.Lock()


def set_aside(messages: list[dict], pattern: Optional[re.Pattern]) -> tuple[list[dict], dict[str, str]]:
    """The messages with stand-ins for their tags, and every stand-in's tag. Unchanged without a pattern."""
    if pattern is None or "data" not in pattern.groupindex:
        return messages, {}
    tags: dict[str, str] = {}
    replaced = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            aside = message_set_aside(content, pattern)
            tags.update(aside.tags)
            message = {**message, "content": aside.text}
        replaced.append(message)
    return replaced, tags


def message_set_aside(content: str, pattern: re.Pattern) -> SetAside:
    key = (content, pattern.pattern)
    aside = SET_ASIDE.get(key)
    if aside is None:
        aside = stand_ins(content, pattern)
        SET_ASIDE.put(key, aside)
    return aside


def stand_ins(content: str, pattern: re.Pattern) -> SetAside:
    """`content` with each tag's data replaced by a key of its own; a tag whose stand-in the pattern would
    not match stays as it is."""
    pieces, tags, position = [], {}, 0
    for match in pattern.finditer(content):
        start, end = match.span("data")
        stand_in = content[match.start():start] + f"{KEY}{next(_numbers)}" + content[end:match.end()]
        if pattern.fullmatch(stand_in) is None:
            continue
        pieces += [content[position:match.start()], stand_in]
        tags[stand_in] = match.group(0)
        position = match.end()
    if not tags:
        return SetAside(content, {})
    pieces.append(content[position:])
    return SetAside("".join(pieces), tags)


def put_back(rendered: str, tags: dict[str, str], pattern: Optional[re.Pattern]) -> str:
    """The prompt: `rendered` with each stand-in's tag in its place (one copy of the pictures' data)."""
    if not tags:
        return rendered
    # Stand-ins match the pattern where their tags do: the pattern finds them in the rendered text, and
    # leaving its matches out of that text is the prompt's own `pattern.sub("", prompt)`.
    prompt = pattern.sub(lambda match: tags.get(match.group(0), match.group(0)), rendered)
    remember_plain(prompt, pattern.sub("", rendered))
    return prompt


def remember_plain(prompt: str, plain: str) -> None:
    global _recent
    with _lock:
        _recent = (_recent + [(prompt, plain)])[-RECENT_PROMPTS:]


def plain_text(prompt: str) -> Optional[str]:
    """`prompt` without its tags, where `put_back` put it together lately (the very string); else None."""
    for recent, plain in reversed(_recent):
        if recent is prompt:
            return plain
    return None
