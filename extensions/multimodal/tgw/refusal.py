"""A picture the extension refuses, raised as the host shows a caller's mistake.

The extension raises `ImageDecodeError` (a ValueError) naming the picture, the cause and the fix.
This repository's host answers it itself (HTTP 400 with the message; the chat shows it). Today's
text-generation-webui answers any exception but its own `modules.api.errors.OpenAIError` with a bare
"500 Internal Server Error", and its page shows the message of a `gradio.Error` only. So, where the
host has `InvalidRequestError`, a refusal leaves the hooks as `PictureRefused`: that class (its API
answers HTTP 400 with `{"error": {"message": ..., "type": "invalid_request_error", ...}}`) and, where
Gradio is installed, a `gradio.Error` too (its chat shows the message in a toast). Elsewhere the
`ImageDecodeError` leaves as it is.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, Optional

from extensions.multimodal.core.image_codec import ImageDecodeError

_classes: dict[str, Optional[type]] = {}


def refusal_class() -> Optional[type]:
    """The host's exception class for a refused picture, or None where the host has none of its own."""
    if "class" not in _classes:
        _classes["class"] = build_refusal_class()
    return _classes["class"]


def build_refusal_class() -> Optional[type]:
    try:
        invalid_request = importlib.import_module("modules.api.errors").InvalidRequestError
    except (ImportError, AttributeError):
        return None
    try:
        gradio_error = importlib.import_module("gradio").Error
    except (ImportError, AttributeError):
        gradio_error = None
    bases = (invalid_request,) if gradio_error is None else (invalid_request, gradio_error)

    def __init__(self, message: str) -> None:
        invalid_request.__init__(self, message, param="messages")  # status 400, the API's error body
        if gradio_error is not None:
            gradio_error.__init__(self, message)  # the page's toast

    def __str__(self) -> str:
        return self.message

    return type("PictureRefused", bases, {"__init__": __init__, "__str__": __str__})


def host_errors(hook: Callable) -> Callable:
    """`hook` with a refused picture raised as the host's own refusal (see the module docstring)."""
    @functools.wraps(hook)
    def wrapped(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except ImageDecodeError as error:
            refusal = refusal_class()
            if refusal is None:
                raise
            raise refusal(str(error)) from error
    return wrapped
