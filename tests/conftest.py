"""Shared fixtures: tiny model folders (built once per session) and loading them into the host."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from tests import tiny_models  # noqa: E402


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return tiny_models.build_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def llava_dir(tmp_path_factory) -> Path:
    return tiny_models.build_llava(tmp_path_factory.mktemp("models") / "tiny-llava-hf")


@pytest.fixture(scope="session")
def llava_next_dir(tmp_path_factory) -> Path:
    return tiny_models.build_llava_next(tmp_path_factory.mktemp("models") / "tiny-llava-next-hf")


@pytest.fixture(scope="session")
def llava_original_dirs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("models")
    clip = base / "tiny-clip"
    return tiny_models.build_llava_original(base / "tiny-llava-v1.5-7b", clip), clip


@pytest.fixture
def llama(host, llama_dir):
    """The tiny Llama loaded into the host, as `server.py --model` would."""
    host.load(llama_dir)
    return host


@pytest.fixture
def host():
    """Restores the host's global state after a test that loads models or extensions."""
    from tests import host_helpers

    snapshot = host_helpers.snapshot()
    yield host_helpers
    host_helpers.restore(snapshot)


@pytest.fixture(scope="module")
def llama_api(llama_dir):
    """A live OpenAI-compatible API on the tiny Llama (one server per test module)."""
    from tests import api_helpers

    with api_helpers.serving(llama_dir) as api:
        yield api


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (one per test module)."""
    from tests.browser_helpers import chromium

    with chromium() as b:
        yield b
