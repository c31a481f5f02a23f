"""The endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions.

Each completion request: read the body under the byte cap (413), validate it (400/422), check a
model is loaded (503), turn messages and images into a prompt (400/413), then run the generation
behind the host's one generation lock, in its own thread. A stream starts only once the first
reply exists, so errors before the first token still get their status code.
"""
from __future__ import annotations

import hmac
import time
from typing import AsyncIterator, Callable, Iterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from modules import chat, shared
from modules.api import generation, messages, responses
from modules.api.capped_read import TooLarge, read_capped
from modules.api.config import APIConfig
from modules.api.errors import APIError
from modules.api.generation import ClientGone, DeltaTracker, GenerationRun
from modules.api.schemas import ChatCompletionRequest, CompletionRequest, GenerationParams, parse_body
from modules.logging_colors import logger

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show what happened


def build_router(config: APIConfig) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=[Depends(key_checker(config))])

    @router.get("/models")
    async def list_models() -> dict:
        data = [model_card()] if shared.model is not None else []
        return {"object": "list", "data": data}

    @router.get("/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        if shared.model is None or model_id != shared.model_name:
            raise APIError(404, f"Model {model_id!r} is not loaded; loaded: {shared.model_name}", code="model_not_found")
        return model_card()

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        params = parse_body(ChatCompletionRequest, await read_body(request, config.max_body_bytes))
        require_model()
        state = generation.request_state(params)
        chat_in = await messages.chat_input(params.messages, config)
        return await respond(request, params, state, lambda: generation.chat_replies(chat_in, state),
                             responses.Shape(chat=True), config)

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        params = parse_body(CompletionRequest, await read_body(request, config.max_body_bytes))
        require_model()
        prompt = single_prompt(params.prompt)
        state = generation.request_state(params)
        return await respond(request, params, state, lambda: generation.completion_replies(prompt, state),
                             responses.Shape(chat=False), config)

    return router


def key_checker(config: APIConfig) -> Callable:
    async def check(request: Request) -> None:
        if not config.api_key:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), config.api_key.encode()):
            raise APIError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY' with the key given "
                                "to --api-key", code="invalid_api_key")
    return check


def model_card() -> dict:
    return {"id": shared.model_name, "object": "model", "created": int(time.time()), "owned_by": "local"}


def require_model() -> None:
    if shared.model is None:
        raise APIError(503, shared.NO_MODEL_MESSAGE, code="model_not_loaded")


def single_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise APIError(422, f"prompt holds {len(prompt)} prompts; this server generates one at a time, send one",
                       param="prompt", code="invalid_parameter")
    return prompt[0]


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes; a larger one is drained and answered 413."""
    try:
        return await read_capped(request.stream(), request.headers.get("content-length"), limit)
    except TooLarge as error:
        await drain(request, limit)
        raise body_too_large(error.size, limit) from None


async def drain(request: Request, limit: int) -> None:
    """Read and drop the rest of an oversized body (up to a bound), so the client reads our 413
    instead of a reset connection. Reads the ASGI channel directly: `request.stream()` may be mid-way."""
    size = 0
    while size <= 4 * limit:
        message = await request.receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def body_too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"The request body ({size} bytes or more) is larger than the {limit}-byte limit; "
                         f"send large images as http(s) URLs or smaller files", code="request_too_large")


async def respond(request: Request, params: GenerationParams, state: dict, make_replies: Callable[[], Iterator[str]],
                  shape: responses.Shape, config: APIConfig) -> Response:
    run = GenerationRun(make_replies, state)
    try:
        if not params.stream:
            text = await run.final_reply(request)
            run.cancel()  # finished: only stops watching for a disconnect
            return JSONResponse(shape.body(finished(text, state, shape)))
        first = await run.next_item(request)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    except BaseException as error:
        run.cancel()
        if isinstance(error, Exception):
            raise generation.generation_error(error) from None
        raise
    if first[0] == "error":
        raise generation.generation_error(first[1])
    include_usage = bool(params.stream_options and params.stream_options.include_usage)
    return GenerationStream(stream_events(request, run, first, state, shape, include_usage), run)


class GenerationStream(StreamingResponse):
    """An SSE response that cancels its generation however it ends, even if the client left before
    the first byte and the event generator never started."""

    def __init__(self, events: AsyncIterator[str], run: GenerationRun):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()


def finished(text: str, state: dict, shape: responses.Shape) -> responses.Reply:
    warnings = [str(n) for n in state.get("notices") or []]
    for warning in warnings:
        logger.warning(f"API {shape.id}: {warning}")
    return responses.Reply(text, state.get("generation_stats", {}), warnings, state.get(chat.IMAGE_TOKENS),
                           list(state.get(chat.DROPPED_IMAGES) or []), int(state.get(chat.DROPPED_TURNS) or 0))


async def stream_events(request: Request, run: GenerationRun, first: tuple, state: dict, shape: responses.Shape,
                        include_usage: bool) -> AsyncIterator[str]:
    """SSE: a role chunk (chat), content deltas, a finish chunk, optionally usage, then [DONE].
    However the stream ends (done, error, client gone), the generation is cancelled."""
    tracker, item, text = DeltaTracker(), first, ""
    try:
        if shape.chat:
            yield responses.sse(shape.chunk("", role=True))
        while item[0] == "reply":
            text = item[1]
            if delta := tracker.step(text):
                yield responses.sse(shape.chunk(delta))
            item = await run.next_item(request)
        if item[0] == "error":
            yield responses.sse(generation.generation_error(item[1]).body())
            return
        reply = finished(text, state, shape)
        if delta := tracker.step(text, final=True):
            yield responses.sse(shape.chunk(delta))
        yield responses.sse(shape.final_chunk(reply))
        if include_usage:
            yield responses.sse(shape.usage_chunk(reply))
        yield responses.DONE
    except ClientGone:
        return
    finally:
        run.cancel()
