"""Where a reply is generated: the local transformers model (the default), or a remote engine.

A remote engine is a server that generates from a prompt and pictures: vLLM through its
OpenAI-compatible API (`modules/openai_engine.py`). The host keeps everything else of a turn - the
history, the hooks, the prompt, truncation, picture costs, stopping strings - and hands the engine
one `EngineRequest` per reply. Another server (SGLang, say) needs only another `RemoteEngine`.

`shared.engine` is the remote engine, or None for the local model. The local model generates one
reply at a time (`shared.generation_lock`); a remote engine takes many at once (`concurrent`) and
batches them itself.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit


class EngineUnavailableError(RuntimeError):
    """The engine could not be reached, did not answer in time, or broke off a reply (the API's 503)."""
    code = "engine_unavailable"


class EngineUnreachableError(EngineUnavailableError):
    """Nothing answers at the engine's address (not running yet, or gone)."""


class EngineRefusedError(ValueError):
    """The engine refused the request as given: too many pictures, too long a prompt (the API's 400)."""
    code = "engine_refused"


@dataclass
class EngineRequest:
    """One reply to generate: the prompt exactly as the host rendered it, its pictures, and the samplers."""
    prompt_pieces: list[str]  # the rendered prompt's text around its pictures: one more piece than pictures
    images: list[str]  # the pictures as data URLs (the bytes the history holds), in prompt order
    image_placeholder: str  # the text the model's chat template writes for a picture (its processor expands it)
    add_special_tokens: bool  # whether the engine's tokenizer adds its own special tokens (the BOS)
    sampling: dict[str, Any]  # OpenAI / vLLM request fields: max_tokens, temperature, seed, stop, ...
    processor_kwargs: dict[str, Any] = field(default_factory=dict)  # the picture budget, for the processor


@dataclass
class EngineChunk:
    """A piece of a streamed reply. The last one carries the counts and why the reply ended."""
    text: str = ""
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    finish_reason: Optional[str] = None  # "stop" (an end token or a stopping string) or "length"


@dataclass
class ServedModel:
    name: str  # the name requests use
    max_model_len: Optional[int]  # the engine's context length, when it says


class RemoteEngine(ABC):
    concurrent = True  # replies run side by side; the engine batches them
    # The engine's context (vLLM's --max-model-len) once `served_model` has told it: no prompt and reply
    # go past it, whatever truncation_length a request sets (`chat.new_state`).
    max_model_len: Optional[int] = None
    # The host's logits-processor classes the engine runs too (`--logits-processors` beside `--engine-url`).
    logits_processors: tuple = ()

    @property
    @abstractmethod
    def description(self) -> str:
        """What the engine is, for messages, with no secret in it ("vLLM at http://host:8000/v1")."""

    @abstractmethod
    def served_model(self, name: Optional[str]) -> ServedModel:
        """The model `name` (None: the only one served), as the engine serves it."""

    @abstractmethod
    def stream(self, request: EngineRequest, stop: Optional[threading.Event] = None) -> Iterator[EngineChunk]:
        """The reply's chunks; closing the iterator, or setting `stop` (even while the engine sends
        nothing), ends it and aborts the request. Raises EngineUnavailableError or EngineRefusedError."""

    def check(self) -> None:
        """Raise a start-up error for an engine the host cannot use as it is (e.g. a flag it needs)."""

    def close(self) -> None:
        """Release connections."""


def safe_url(url: str) -> str:
    """`url` without a user name or password, for logs and messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
