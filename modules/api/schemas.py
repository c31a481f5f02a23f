"""Request bodies: parse and validate in one step, with OpenAI's parameter names and ranges.

Validation is strict (a string where a number belongs is refused rather than coerced) and runs on
the raw JSON bytes. Unknown fields are ignored, as OpenAI clients send many we do not use
(`frequency_penalty`, `logprobs`, `user`, ...). Message contents are checked by `messages`, not here.
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from modules.api.errors import APIError

# The name pydantic gives a union's member in an error's place: `str`, `int`, `list[str]`, ...
UNION_MEMBER = re.compile(r"str|int|float|bool|none|[\w-]+\[.*\]")
# A UTF-16 surrogate left alone once JSON's escapes are read (a pair is read as its one character).
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class GenerationParams(BaseModel):
    """What both completion endpoints accept; None means the host's setting."""
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # newer clients' name for max_tokens
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None  # a stop string may be any length
    seed: int | None = Field(None, ge=-2**63, le=2**64 - 1)  # what torch takes, as text-generation-webui
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one generation at a time: several choices would queue behind each other
    # text-generation-webui extras.
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    ban_eos_token: bool | None = None
    truncation_length: int | None = Field(None, ge=1)
    # What each picture may cost, for the image extension: "default", "low", "high" or a number of pixels.
    image_budget: str | int | None = None
    # Arguments for the loaded logits processors (their `RequestParams.extra_args`); vLLM's name works too.
    logits_processor_args: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    @field_validator("stream", "n", mode="before")
    @classmethod
    def null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """OpenAI's schema lets both be null; clients that send every field of theirs send it."""
        return cls.model_fields[info.field_name].default if value is None else value


class ChatCompletionRequest(GenerationParams):
    messages: list[dict[str, Any]] = Field(min_length=1)


class CompletionRequest(GenerationParams):
    prompt: str | list[str]  # "" too: OpenAI generates from the start of a document


def parse_body(model: type[BaseModel], body: bytes) -> Any:
    """Raises APIError: 400 for bytes that are not a JSON object, 422 for invalid parameters."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        value = surrogates_replaced(body, error)
        if value is None:
            raise error_from_validation(error) from None
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise error_from_validation(error) from None


def surrogates_replaced(body: bytes, error: ValidationError) -> Any:
    """The body, when it is JSON that pydantic's parser refuses only for a lone UTF-16 surrogate
    (`"\\ud83d"`: JavaScript writes one for a string cut inside an emoji), with each such surrogate
    made U+FFFD, as unreadable bytes are. A history holding one is sent again every turn, so refusing
    it would end the chat. None for any other invalid body."""
    if error.errors(include_url=False)[0].get("type") != "json_invalid":
        return None
    try:
        value = json.loads(body)  # NaN and Infinity too, as pydantic's parser reads them
    except ValueError:  # not JSON: pydantic's message says where
        return None
    return replaced(value)


def replaced(value: Any) -> Any:
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replaced(item) for item in value]
    if isinstance(value, dict):
        return {replaced(key): replaced(item) for key, item in value.items()}
    return value


def error_from_validation(error: ValidationError) -> APIError:
    problems = error.errors(include_url=False)
    first = problems[0] if problems else {}
    if first.get("type") == "json_invalid":
        return APIError(400, f"The request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        code="invalid_json")
    if not first.get("loc"):
        return APIError(400, f"The request body must be a JSON object, got {type_name(first.get('input'))}",
                        code="invalid_json")
    loc = param_path(first["loc"])
    # A union's members each say why they refused the value: all of them, for the parameter they share.
    alike = [p for p in problems if p["loc"][:1] == first["loc"][:1]]
    why = ", or ".join(p["msg"] if param_path(p["loc"]) == loc else f"'{param_path(p['loc'])}': {p['msg']}"
                       for p in alike)
    got = "" if first.get("type") == "missing" else f" (got {first.get('input')!r:.80})"
    others = len(problems) - len(alike)
    more = f"; and {others} more problem(s)" if others else ""
    return APIError(422, f"Invalid parameter '{loc}': {why}{got}{more}", param=loc, code="invalid_parameter")


def param_path(loc: tuple) -> str:
    """A problem's place as the client names it: `stop`, `stream_options.include_usage`, `stop.1`, without
    the union member pydantic tried (`stop.str`, `stop.list[str].1`)."""
    return ".".join(str(x) for x in loc if not (isinstance(x, str) and UNION_MEMBER.fullmatch(x)))


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__
