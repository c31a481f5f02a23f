"""A live API server for tests: the real app under uvicorn on a free 127.0.0.1 port, in a thread.

The model comes from `tests/host_helpers.load`, so requests run through the host exactly as in
production; nothing is mocked. `start_api(config)` returns a `LiveAPI` with `.url`, `.client()`
(the official `openai` package) and `.post()` (raw httpx, for malformed bodies and status codes).
"""
from __future__ import annotations

import base64
import io
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
from PIL import Image, ImageDraw

from modules import shared
from modules.api.config import APIConfig
from modules.api.server import BackgroundServer, create_app
from tools.vllm_cpu.process import free_port


@dataclass
class LiveAPI:
    server: BackgroundServer
    api_key: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/v1"

    def client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=60, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if self.api_key:
            headers.setdefault("Authorization", f"Bearer {self.api_key}")
        return httpx.post(f"{self.url}{path}", headers=headers, timeout=60, **kwargs)

    def stop(self) -> None:
        self.server.stop()


def start_api(config: APIConfig | None = None) -> LiveAPI:
    config = config or APIConfig()
    server = BackgroundServer(create_app(config), "127.0.0.1", free_port()).start()
    return LiveAPI(server, config.api_key)


def wait_until_unlocked(timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while shared.generation_lock.locked():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def image_bytes(colour: str = "red", shape: str = "circle", size: int = 32, fmt: str = "PNG") -> bytes:
    """A picture of one coloured shape on white."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    box = (size // 6, size // 6, size - size // 6, size - size // 6)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([(size // 2, box[1]), (box[2], box[3]), (box[0], box[3])], fill=colour)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


@contextmanager
def serving(model_dir: Path, extension_names: list[str] | None = None, **load_kwargs):
    """Loads `model_dir` into the host (`load_kwargs` as in `host_helpers.load`), serves the API on a free
    port, and restores the host afterwards."""
    from tests import host_helpers

    saved = host_helpers.snapshot()
    host_helpers.load(model_dir, extension_names, **load_kwargs)
    api = start_api()
    try:
        yield api
    finally:
        api.stop()
        host_helpers.restore(saved)
