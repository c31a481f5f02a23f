"""A picture the extension refuses, raised as the host shows a caller's mistake.

The extension raises `ImageDecodeError` (a ValueError) naming the picture, the cause and the fix.
This repository's host answers it itself (HTTP 400 with the message; the chat shows it). Today's
text-generation-webui answers any exception but its own `modules.api.errors.OpenAIError` with a bare
"500 Internal Server Error", and its page shows the message of a `gradio.Error` only. So, where the
host has `InvalidRequestError`, a refusal leaves the hooks as `PictureRefused`: that class (its API
answers HTTP 400 with `{"error": {"message": ..., "type": "invalid_request_error", ...}}`) and, where
Gradio is installed, a `gradio.Error` too (its chat shows the message in a toast). Elsewhere the
`ImageDecodeError` leaves as it is. The engine's refusals (tgw/engine_client.py) leave the same way, and an
engine that is down as `EngineUnavailable` (the API's `ServiceUnavailableError`, 503, and a toast).
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, Optional

from extensions.multimodal.core.image_codec import ImageDecodeError
from extensions.multimodal.tgw.engine_client import EngineRefusedError, EngineUnavailableError

_classes: dict[str, Optional[type]] = {}


def refusal_class() -> Optional[type]:
    """The host's exception class for a refused picture or request (400), or None where it has none."""
    return host_class("InvalidRequestError", "PictureRefused", param="messages")


def unavailable_class() -> Optional[type]:
    """The host's exception class for an engine that is down or stuck (503), or None where it has none."""
    return host_class("ServiceUnavailableError", "EngineUnavailable")


def host_class(base_name: str, name: str, **base_kwargs) -> Optional[type]:
    if name not in _classes:
        _classes[name] = build_class(base_name, name, base_kwargs)
    return _classes[name]


def build_class(base_name: str, name: str, base_kwargs: dict) -> Optional[type]:
    try:
        base = getattr(importlib.import_module("modules.api.errors"), base_name)
    except (ImportError, AttributeError):
        return None
    try:
        gradio_error = importlib.import_module("gradio").Error
    except (ImportError, AttributeError):
        gradio_error = None
    bases = (base,) if gradio_error is None else (base, gradio_error)

    def __init__(self, message: str) -> None:
        base.__init__(self, message, **base_kwargs)  # its status and the API's error body
        if gradio_error is not None:
            gradio_error.__init__(self, message)  # the page's toast

    def __str__(self) -> str:
        return self.message

    return type(name, bases, {"__init__": __init__, "__str__": __str__})


def host_errors(hook: Callable) -> Callable:
    """`hook` with a refusal (a picture, or the engine's) and an engine that is down raised as the host's
    own errors (see the module docstring)."""
    @functools.wraps(hook)
    def wrapped(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except (ImageDecodeError, EngineRefusedError) as error:
            raise_as(refusal_class(), error)
        except EngineUnavailableError as error:
            raise_as(unavailable_class(), error)
    return wrapped


def raise_as(host_class: Optional[type], error: Exception) -> None:
    if host_class is None:
        raise error
    raise host_class(str(error)) from error
