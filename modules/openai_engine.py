"""vLLM (or a server like it) as the engine, through its OpenAI-compatible chat endpoint.

The host has already rendered the prompt with the model's chat template, exactly as the local
engine would use it. It goes to `POST {url}/chat/completions` as one message whose parts are the
prompt's text and its pictures, in place, with a chat template of the request's own that writes
those parts as they are and each picture as the model's image placeholder (vLLM's processor then
expands it). So the engine's prompt is the host's, token for token: the host's hooks, truncation and
costs hold. vLLM refuses a request's template unless started with `--trust-request-chat-template`;
`check()` says so at start-up. The BOS follows `add_special_tokens` (vLLM's chat endpoint adds none
by default). Replies stream back as server-sent events; closing the stream (the stop button, a client
gone) makes vLLM abort the request.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import httpx

from modules.engine import (EngineChunk, EngineRefusedError, EngineRequest, EngineUnavailableError,
                            EngineUnreachableError, RemoteEngine, ServedModel, safe_url)

CONNECT_SECONDS = 5.0
STOP_POLL_SECONDS = 0.1


def context_length(entry: dict[str, Any]) -> Optional[int]:
    """A `/v1/models` entry's context (vLLM's `max_model_len`), where it gives a length."""
    length = entry.get("max_model_len")
    return length if type(length) is int and length > 0 else None


def parts_template(image_placeholder: str) -> str:
    """A chat template that writes each text part as it is and each image part as `image_placeholder`."""
    return ("{%- for message in messages -%}{%- for part in message['content'] -%}"
            "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- else -%}{{ " + json.dumps(image_placeholder) +
            " }}{%- endif -%}{%- endfor -%}{%- endfor -%}")


class OpenAIChatEngine(RemoteEngine):
    def __init__(self, url: str, api_key: str = "", timeout: float = 120.0, kind: str = "vLLM"):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.kind = kind
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=CONNECT_SECONDS),
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        self.model: Optional[str] = None

    @property
    def description(self) -> str:
        return f"{self.kind} at {safe_url(self.url)}"

    def served_model(self, name: Optional[str]) -> ServedModel:
        listed = self._get("/models").get("data") or []
        names = [str(entry.get("id")) for entry in listed]
        if name is None and len(names) != 1:
            raise EngineUnavailableError(f"The {self.description} serves {len(names)} models ({', '.join(names) or 'none'}): "
                                         f"name one with --model.")
        chosen = name if name is not None else names[0]
        if chosen not in names:
            raise EngineUnavailableError(f"The {self.description} does not serve {chosen!r}; it serves: {', '.join(names)}.")
        entry = listed[names.index(chosen)]
        self.model, self.max_model_len = chosen, context_length(entry)
        return ServedModel(chosen, self.max_model_len)

    def check(self) -> None:
        """One token through a request template: refused unless vLLM trusts request templates."""
        probe = EngineRequest(prompt_pieces=["Hello"], images=[], image_placeholder="", add_special_tokens=True,
                              sampling={"max_tokens": 1, "temperature": 0})
        try:
            for _ in self.stream(probe):
                pass
        except EngineRefusedError as error:
            if "trust-request-chat-template" in str(error):
                raise EngineUnavailableError(
                    f"The {self.description} refuses the host's prompts: start it with --trust-request-chat-template "
                    f"(the host sends each prompt as it rendered it, through a template of the request's own).") from None
            raise

    def body(self, request: EngineRequest) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for index, text in enumerate(request.prompt_pieces):
            if text:
                content.append({"type": "text", "text": text})
            if index < len(request.images):
                content.append({"type": "image_url", "image_url": {"url": request.images[index]}})
        body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                "chat_template": parts_template(request.image_placeholder), "add_generation_prompt": False,
                "add_special_tokens": request.add_special_tokens, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **request.sampling}
        if request.processor_kwargs:
            body["mm_processor_kwargs"] = request.processor_kwargs
        return body

    def stream(self, request: EngineRequest, stop: Optional[threading.Event] = None) -> Iterator[EngineChunk]:
        stop = stop or threading.Event()
        try:
            with self.client.stream("POST", self.url + "/chat/completions", json=self.body(request)) as response:
                if response.status_code != 200:
                    response.read()
                    raise self._refusal(response)
                with closed_on(stop, response):
                    yield from self._chunks(response, stop)
        except (httpx.TransportError, httpx.StreamError) as error:
            if stop.is_set():
                return  # closed on purpose: the stop button, a client gone
            if isinstance(error, httpx.TimeoutException):
                raise EngineUnavailableError(f"The {self.description} did not answer within {self.timeout:g} s "
                                             f"(busy or stuck; the host's --engine-timeout).") from None
            raise EngineUnreachableError(f"The {self.description} cannot be reached or broke off the reply "
                                         f"({type(error).__name__}). Is it running? Once it is back, send again.") from None

    def _chunks(self, response: httpx.Response, stop: threading.Event) -> Iterator[EngineChunk]:
        finished = False
        for line in response.iter_lines():
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
        if not finished and not stop.is_set():
            raise EngineUnavailableError(f"The {self.description} ended the reply before it was finished "
                                         f"(restarted?). Once it is back, send again.")

    def _refusal(self, response: httpx.Response) -> Exception:
        try:
            message = error_message(response.json())
        except ValueError:
            message = response.text[:300]
        if response.status_code in (400, 413, 422):
            return EngineRefusedError(f"The {self.description} refused the request: {message}")
        if response.status_code in (401, 403):
            return EngineUnavailableError(f"The {self.description} refused the host's key ({response.status_code}): "
                                          f"give the key it was started with as --engine-api-key.")
        return EngineUnavailableError(f"The {self.description} answered {response.status_code}: {message}")

    def _get(self, path: str) -> dict:
        try:
            response = self.client.get(self.url + path)
        except httpx.TimeoutException:
            raise EngineUnavailableError(f"The {self.description} did not answer within {self.timeout:g} s.") from None
        except httpx.TransportError as error:
            raise EngineUnreachableError(f"The {self.description} cannot be reached ({type(error).__name__}): "
                                         f"is it running, and is --engine-url right?") from None
        if response.status_code != 200:
            raise self._refusal(response)
        return response.json()

    def close(self) -> None:
        self.client.close()


@contextmanager
def closed_on(stop: threading.Event, response: httpx.Response) -> Iterator[None]:
    """Close `response` as soon as `stop` is set, from a watching thread: a read blocked on an engine that
    sends nothing (a long prefill, a busy server) ends then, not at the next chunk."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(STOP_POLL_SECONDS):
                response.close()
                return

    watcher = threading.Thread(target=watch, daemon=True, name="engine-stop")
    watcher.start()
    try:
        yield
    finally:
        done.set()


def chunk_of(event: dict) -> EngineChunk:
    choice = (event.get("choices") or [{}])[0]
    usage = event.get("usage") or {}
    delta = choice.get("delta") or {}
    return EngineChunk(text=delta.get("content") or "", prompt_tokens=usage.get("prompt_tokens"),
                       completion_tokens=usage.get("completion_tokens"), finish_reason=choice.get("finish_reason"))


def error_message(body: Any) -> str:
    """The message of vLLM's error bodies (`{"error": {"message"}}`, or the older `{"message"}`)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(body)[:300]
