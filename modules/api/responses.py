"""OpenAI response bodies and stream chunks for chat completions and completions.

`Reply` carries what one generation produced; `Shape` knows the endpoint's object names and where
the text goes (`message.content` / `delta.content` for chat, `text` for completions). Warnings from
`state['notices']` (e.g. images removed by truncation) ride in a `warnings` field. Beyond OpenAI's
fields: `usage.prompt_tokens_details.image_tokens` (the prompt tokens the pictures take, when the
prompt holds any), `dropped_turns` (how many of the oldest turns were left out to fit the context) and
`dropped_images` (`[{"turn": n, "image": k}]`: the pictures left out to fit the context, by their turn
among the request's messages and their place in it, both 1-based).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from modules import shared


@dataclass
class Reply:
    text: str
    stats: dict[str, Any]  # state['generation_stats']: prompt_tokens, completion_tokens, finish_reason
    warnings: list[str] = field(default_factory=list)
    image_tokens: list[int] | None = None  # per picture kept in the prompt; None: no picture
    dropped_images: list[dict] = field(default_factory=list)
    dropped_turns: int = 0


@dataclass
class Shape:
    chat: bool
    id: str = ""
    created: int = 0

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    def header(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": shared.model_name}

    def body(self, reply: Reply) -> dict[str, Any]:
        finish = reply.stats.get("finish_reason", "stop")
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": reply.text, "logprobs": None, "finish_reason": finish}
        body = self.header("chat.completion" if self.chat else "text_completion")
        body.update(choices=[choice], usage=usage(reply))
        return body | extras(reply)

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body = self.header("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = [choice]
        return body

    def final_chunk(self, reply: Reply) -> dict[str, Any]:
        return self.chunk(None, reply.stats.get("finish_reason", "stop")) | extras(reply)

    def usage_chunk(self, reply: Reply) -> dict[str, Any]:
        body = self.header("chat.completion.chunk" if self.chat else "text_completion")
        body.update(choices=[], usage=usage(reply))
        return body


def usage(reply: Reply) -> dict[str, Any]:
    prompt, completion = int(reply.stats.get("prompt_tokens", 0)), int(reply.stats.get("completion_tokens", 0))
    counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
    if reply.image_tokens is not None:
        counts["prompt_tokens_details"] = {"image_tokens": sum(reply.image_tokens)}
    return counts


def extras(reply: Reply) -> dict[str, Any]:
    """The fields beyond OpenAI's a reply has: `warnings`, `dropped_turns`, `dropped_images`."""
    fields: dict[str, Any] = {}
    if reply.warnings:
        fields["warnings"] = reply.warnings
    if reply.dropped_turns:
        fields["dropped_turns"] = reply.dropped_turns
    if reply.dropped_images:
        fields["dropped_images"] = reply.dropped_images
    return fields


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


DONE = sse("[DONE]")
