"""A request's generation: its state, its reply texts, and running it for an async request.

A chat completion is the host's one chat turn (`chat.generate_chat_reply`), the UI's own, on a
history built from the request's messages: every extension hook runs as in the UI, in
text-generation-webui's order. It differs only where it must: no visible history is kept, the
request's stops and limits apply, and the reply is the internal (model-side) text.
`GenerationRun` iterates a reply generator in its own thread (so a request waiting for
`shared.generation_lock` holds no event-loop time) and hands each cumulative reply to the event
loop. Cancelling it - the client went away - makes the thread close the generator at the next
reply, which stops `model.generate` and releases the lock.
This module knows nothing about HTTP bodies or the OpenAI response format.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Iterator

from starlette.requests import Request

from modules import chat, shared
from modules.api.errors import APIError
from modules.api.messages import ChatInput
from modules.api.schemas import GenerationParams
from modules.engine import EngineUnavailableError
from modules.logging_colors import logger
from modules.text_generation import generate_reply, get_custom_stopping_strings


class ClientGone(Exception):
    """The HTTP client disconnected; the generation was cancelled."""


def request_state(params: GenerationParams) -> dict[str, Any]:
    """`chat.new_state` with what the request sets (`request_values`); the request's stops join the
    settings' own, as text-generation-webui's API does. Raises APIError 422 for a reply length that
    leaves no room for the prompt."""
    state = chat.new_state(**request_values(params))
    if state["max_new_tokens"] >= state["truncation_length"]:
        # Blame what the request set: a short truncation_length under the settings' max_new_tokens, say.
        param = ("max_completion_tokens" if params.max_completion_tokens else "max_tokens" if params.max_tokens
                 else "truncation_length" if params.truncation_length is not None else "max_tokens")
        raise APIError(422, f"max_tokens ({state['max_new_tokens']}) must be below the context length, "
                            f"truncation_length ({state['truncation_length']} tokens), leaving room for the prompt",
                       param=param, code="invalid_parameter")
    stops = request_stops(params)
    if stops:
        state["custom_stopping_strings"] = get_custom_stopping_strings(state) + stops
    return state


def request_values(params: GenerationParams) -> dict[str, Any]:
    """The request's parameters under their state keys; one it leaves out (None) keeps the host's
    setting, except the seed (none: a random one). Temperature 0 means greedy, above 0 sampling."""
    if params.logits_processor_args is not None and params.vllm_xargs is not None:
        raise APIError(422, "Send logits_processor_args or vllm_xargs (the same thing under vLLM's name), not both",
                       param="vllm_xargs", code="invalid_parameter")
    values = {
        "truncation_length": params.truncation_length,
        "max_new_tokens": params.max_completion_tokens or params.max_tokens,
        "temperature": params.temperature,
        "do_sample": None if params.temperature is None else params.temperature > 0,
        "top_p": params.top_p, "top_k": params.top_k, "repetition_penalty": params.repetition_penalty,
        "ban_eos_token": params.ban_eos_token,
        chat.IMAGE_BUDGET: params.image_budget,
        "logits_processor_args": params.logits_processor_args if params.logits_processor_args is not None
        else params.vllm_xargs,
    }
    values = {key: value for key, value in values.items() if value is not None}
    values.update(stream=params.stream, seed=-1 if params.seed is None else params.seed)
    return values


def request_stops(params: GenerationParams) -> list[str]:
    stop = params.stop
    return [stop] if isinstance(stop, str) and stop else [s for s in (stop or []) if s]


def chat_replies(chat_in: ChatInput, state: dict) -> Iterator[str]:
    """The chat turn on the request's messages: cumulative texts of the new reply."""
    if chat_in.system_message:
        state["system_message"] = chat_in.system_message
    state["history"] = chat.history_from_turns(chat_in.turns, state)
    state[chat.MESSAGE_IMAGES] = list(chat_in.user_input.images) or None
    before = chat_in.turns[-1][2] if chat_in.continue_last else ""
    for history in chat.generate_chat_reply(chat_in.user_input.text, state, _continue=chat_in.continue_last,
                                            loading_message=False):
        yield history["internal"][-1][1][len(before):]


def completion_replies(prompt: str, state: dict) -> Iterator[str]:
    yield from generate_reply(prompt, state, is_chat=False)


class GenerationRun:
    """One generation in a worker thread. Items: ('reply', text), ('done', None), ('error', exception)."""

    def __init__(self, replies: Callable[[], Iterator[str]], state: dict):
        self.loop = asyncio.get_running_loop()
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        # The generation's own stop: set on cancel, so the model stops at its next token and a remote
        # engine's stream is closed at once, not at the next reply.
        state[shared.STOP_EVENT] = self.cancelled
        self.state = state
        self._getter: asyncio.Future | None = None
        self._held: tuple[str, Any] | None = None
        self._watcher: asyncio.Future | None = None
        self.thread = threading.Thread(target=self._work, args=(replies,), daemon=True, name="api-generation")
        self.thread.start()

    def _work(self, make_replies: Callable[[], Iterator[str]]) -> None:
        replies = None
        try:
            replies = make_replies()
            for reply in replies:
                if self.cancelled.is_set():
                    replies.close()  # stops generate_reply's model thread and releases the lock
                    stats = self.state.get("generation_stats", {})
                    logger.info(f"API client disconnected: generation stopped after "
                                f"{stats.get('completion_tokens', 0)} tokens; the lock is free")
                    return
                self._put(("reply", reply))
            self._put(("done", None))
        except Exception as error:  # handed to the request, which answers with a status code
            self._put(("error", error))
        finally:
            if replies is not None:
                replies.close()

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop closed (server shutting down): nobody is listening
            self.cancelled.set()

    def cancel(self) -> None:
        """Stop the generation at its next reply (a no-op once it has finished) and stop watching the client."""
        self.cancelled.set()
        for task in (self._getter, self._watcher):
            if task is not None:
                task.cancel()

    async def next_item(self, request: Request) -> tuple[str, Any]:
        """The next item; raises ClientGone (and cancels) when the client disconnects meanwhile.
        Replies already queued come as the latest one (each is the whole reply so far): a stream that
        fell behind sends one chunk for them, and an item already there costs no task or wait, so the
        event loop holds the GIL that the generating thread needs as little as it can."""
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(wait_for_disconnect(request))
        if self._held is not None:  # the item that ended a run of queued replies
            item, self._held = self._held, None
            return item
        # One pending get() across calls: cancelling a get() that just got an item would drop it.
        if self._getter is None and not self.items.empty() and not self._watcher.done():
            return self._latest(self.items.get_nowait())
        if self._getter is None:
            self._getter = asyncio.ensure_future(self.items.get())
        await asyncio.wait({self._getter, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if self._getter.done():
            item, self._getter = self._getter.result(), None
            return self._latest(item)
        self.cancel()
        raise ClientGone()

    def _latest(self, item: tuple[str, Any]) -> tuple[str, Any]:
        """`item`, or the last of the replies queued right after it; an item of another kind that ends
        them is held for the next call."""
        while item[0] == "reply" and not self.items.empty():
            following = self.items.get_nowait()
            if following[0] != "reply":
                self._held = following
                break
            item = following
        return item

    async def final_reply(self, request: Request) -> str:
        """Waits for the whole generation; raises its error, or ClientGone."""
        reply = ""
        while True:
            kind, value = await self.next_item(request)
            if kind == "reply":
                reply = value
            elif kind == "done":
                return reply
            else:
                raise value


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client disconnects. The body has been read, so the ASGI channel has nothing else
    to say; a pending receive() also keeps the server reading the socket, where it notices the close."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class DeltaTracker:
    """Cumulative replies -> the new text of each step, for streaming."""

    def __init__(self):
        self.sent = ""

    def step(self, reply: str, final: bool = False) -> str:
        if not final:
            # A multi-byte character split across tokens decodes to U+FFFD until its last byte arrives.
            reply = reply.rstrip("\ufffd")
        if not reply.startswith(self.sent):
            # An output extension rewrote text we already sent; SSE cannot take it back.
            logger.warning("API stream: the reply changed text already sent; sending only what follows it")
            delta = reply[len(self.sent):]
            self.sent += delta
            return delta
        delta, self.sent = reply[len(self.sent):], reply
        return delta


def generation_error(error: Exception) -> APIError:
    """Caller mistakes (ValueError, per the extension contract; an engine's refusal) -> 400 with the
    error's `code` when it has one (an undecodable image: `invalid_image`); a remote engine down, slow or
    broken off -> 503; anything else -> 500. Each is logged: an operator sees what clients were told."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, EngineUnavailableError):
        logger.error(f"API request failed: {error}")
        answer = APIError(503, str(error), code=error.code)
    elif isinstance(error, ValueError):
        logger.warning(f"API request refused: {error}")
        answer = APIError(400, str(error), param=getattr(error, "param", None),
                          code=str(getattr(error, "code", None) or "invalid_request"))
    else:
        logger.error("API generation failed", exc_info=error)
        answer = APIError(500, f"Generation failed: {type(error).__name__}: {error}", code="generation_failed")
    answer.logged = True  # here, with the cause (a stream's error event reaches no handler that would log it)
    return answer
