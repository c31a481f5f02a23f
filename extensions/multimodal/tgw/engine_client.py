"""vLLM's OpenAI-compatible chat endpoint, as the engine of text-generation-webui's replies.

Inside text-generation-webui the extension cannot use this repository's host (`modules/openai_engine.py`),
so it speaks the same wire format itself; tests/test_engine_twins.py keeps the two equal (the request's
body, its template, the chunks, the error messages). The prompt goes as the host rendered it: one message
of text and image parts, written back as they are by a chat template of the request's own (vLLM needs
`--trust-request-chat-template`), each picture as the model's image placeholder. The reply streams back
with its token ids (`return_token_ids`), which text-generation-webui decodes and stops on itself.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx

# Where launch.py's --multimodal-engine-url and --multimodal-engine-api-key go (read when a hook runs).
URL_VARIABLE, KEY_VARIABLE = "MULTIMODAL_ENGINE_URL", "MULTIMODAL_ENGINE_API_KEY"
CONNECT_SECONDS = 5.0
STOP_POLL_SECONDS = 0.1


class EngineUnavailableError(RuntimeError):
    """The engine cannot be reached, did not answer in time, or broke off the reply."""


class EngineRefusedError(ValueError):
    """The engine refused the request as given (too many pictures, too long a prompt): vLLM's reason."""


@dataclass
class Chunk:
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: Optional[list[int]] = None  # the first chunk's: the prompt as the engine tokenized it
    finish_reason: Optional[str] = None


def context_length(entry: dict[str, Any]) -> Optional[int]:
    """A `/v1/models` entry's context (vLLM's `max_model_len`), where it gives a length."""
    length = entry.get("max_model_len")
    return length if type(length) is int and length > 0 else None


def engine_url(params: dict) -> str:
    """The engine's URL: the `engine_url` setting, else $MULTIMODAL_ENGINE_URL; "" for none (the local model)."""
    return str(params.get("engine_url") or os.environ.get(URL_VARIABLE) or "")


def parts_template(image_placeholder: str) -> str:
    """A chat template that writes each text part as it is and each image part as `image_placeholder`."""
    return ("{%- for message in messages -%}{%- for part in message['content'] -%}"
            "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- else -%}{{ " + json.dumps(image_placeholder) +
            " }}{%- endif -%}{%- endfor -%}{%- endfor -%}")


def request_body(model: str, pieces: list[str], images: list[str], placeholder: str, add_special_tokens: bool,
                 sampling: dict[str, Any], processor_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The chat request for a prompt's text `pieces` around its `images` (data URLs), in place."""
    content: list[dict[str, Any]] = []
    for index, text in enumerate(pieces):
        if text:
            content.append({"type": "text", "text": text})
        if index < len(images):
            content.append({"type": "image_url", "image_url": {"url": images[index]}})
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "chat_template": parts_template(placeholder), "add_generation_prompt": False,
            "add_special_tokens": add_special_tokens, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **sampling}
    if processor_kwargs:
        body["mm_processor_kwargs"] = processor_kwargs
    return body


class EngineClient:
    def __init__(self, url: str, api_key: str = "", timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=CONNECT_SECONDS))

    @property
    def description(self) -> str:
        return f"vLLM at {safe_url(self.url)}"

    def served_models(self) -> dict[str, Optional[int]]:
        """Each model the engine serves, with its context (vLLM's `max_model_len`) where it says."""
        try:
            response = self.client.get(self.url + "/models")
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"The {self.description} cannot be reached ({type(error).__name__}): is it "
                                         f"running, and is the multimodal engine URL right?") from None
        if response.status_code != 200:
            raise self.refusal(response)
        return {str(entry.get("id")): context_length(entry) for entry in response.json().get("data") or []}

    def open(self, body: dict[str, Any], should_stop: Callable[[], bool]) -> "ReplyStream":
        """Send the request; refusals and an unreachable engine raise here, before any reply."""
        body = {**body, "return_token_ids": True}
        try:
            request = self.client.build_request("POST", self.url + "/chat/completions", json=body)
            response = self.client.send(request, stream=True)
        except httpx.TimeoutException:
            raise EngineUnavailableError(f"The {self.description} did not answer within {self.timeout:g} s.") from None
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"The {self.description} cannot be reached ({type(error).__name__}). "
                                         f"Is it running? Once it is back, send again.") from None
        if response.status_code != 200:
            response.read()
            response.close()
            raise self.refusal(response)
        return ReplyStream(self.description, response, should_stop)

    def refusal(self, response: httpx.Response) -> Exception:
        try:
            message = error_message(response.json())
        except ValueError:
            message = response.text[:300]
        if response.status_code in (400, 413, 422):
            return EngineRefusedError(f"The {self.description} refused the request: {message}")
        if response.status_code in (401, 403):
            return EngineUnavailableError(f"The {self.description} refused the key ({response.status_code}): give the "
                                          f"key it was started with as the multimodal engine API key.")
        return EngineUnavailableError(f"The {self.description} answered {response.status_code}: {message}")


class ReplyStream:
    """The chunks of one reply. Closing it (or `should_stop()` turning true, which a watching thread
    notices even while the engine sends nothing) closes the connection, and vLLM aborts the request."""

    def __init__(self, description: str, response: httpx.Response, should_stop: Callable[[], bool]):
        self.description = description
        self.response = response
        self.done = threading.Event()
        self.stopped = threading.Event()
        self.chunks = self._chunks()
        threading.Thread(target=self._watch, args=(should_stop,), daemon=True, name="engine-stop").start()

    def __iter__(self) -> Iterator[Chunk]:
        return self.chunks

    def __next__(self) -> Chunk:
        return next(self.chunks)

    def close(self) -> None:
        self.done.set()
        self.chunks.close()
        self.response.close()

    def _watch(self, should_stop: Callable[[], bool]) -> None:
        while not self.done.wait(STOP_POLL_SECONDS):
            if should_stop():
                self.stopped.set()
                self.response.close()
                return

    def _chunks(self) -> Iterator[Chunk]:
        finished = False
        try:
            for line in self.response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise EngineUnavailableError(f"The {self.description} stopped the reply: {error_message(event)}")
                chunk = chunk_of(event)
                finished = finished or chunk.finish_reason is not None
                yield chunk
        except (httpx.TransportError, httpx.StreamError) as error:
            if self.stopped.is_set():
                return  # closed on purpose: the Stop button
            if isinstance(error, httpx.TimeoutException):
                raise EngineUnavailableError(f"The {self.description} did not answer within its timeout "
                                             f"(busy or stuck).") from None
            raise EngineUnavailableError(f"The {self.description} broke off the reply ({type(error).__name__}). "
                                         f"Once it is back, send again.") from None
        if not finished and not self.stopped.is_set():
            raise EngineUnavailableError(f"The {self.description} ended the reply before it was finished "
                                         f"(restarted?). Once it is back, send again.")


def chunk_of(event: dict) -> Chunk:
    choice = (event.get("choices") or [{}])[0]
    return Chunk(token_ids=list(choice.get("token_ids") or []), prompt_token_ids=event.get("prompt_token_ids"),
                 finish_reason=choice.get("finish_reason"))


def error_message(body: Any) -> str:
    """The message of vLLM's error bodies (`{"error": {"message"}}`, or the older `{"message"}`)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(body)[:300]


def safe_url(url: str) -> str:
    """`url` without a user name or password, for logs and messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
