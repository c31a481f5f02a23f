"""Shared fixtures: tiny model folders (built once per session) and loading them into the host; which
tests are `slow` (left out of the fast tier, `python -m pytest -m "not slow" -q tests`)."""
from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from fixtures import tiny_models  # noqa: E402

# -- The fast tier ---------------------------------------------------------------------------------
# `slow` (left out by `-m "not slow"`, still run by `python -m pytest -q tests`): a module that checks
# the replies of every VLM family (the 13 checkpoints of fixtures/vlm_families.py) against Hugging Face's,
# starts Chromium or a vLLM server, or trains a model; and, in modules that are otherwise quick, a test that trains or
# runs a script in a fresh process (the demo's training and evaluation, the traced picture turn).
# Measured with `--durations=0` on 2 cores: each of these takes 10 s to 12 min and together they are
# about nine tenths of the full suite; what is left runs every product area's quick tests in ~2 min.
SLOW_MODULES = {
    "test_vlm_families_core.py", "test_vlm_families_host.py", "test_checkpoint_variants.py",  # every family
    "test_browser_chat.py", "test_browser_multimodal.py", "test_browser_demo.py",  # Chromium
    "test_browser_image_budget.py",
    "test_demo_training.py", "test_tower_probe.py",  # train
    "test_engine_vllm.py", "test_engine_faults.py", "test_browser_engine.py",  # a vLLM server
}
SLOW_TESTS = {  # "module::test", without parameters
    "test_demo_model.py::test_training_script_smoke_run_saves_a_loadable_model",
    "test_demo_model.py::test_eval_script_measures_through_the_host",
    "test_demo_model.py::test_eval_script_draws_with_the_independent_renderer",
    "test_picture_path.py::test_the_documented_path_is_the_path_a_picture_takes",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of the fast tier (-m 'not slow'); the rule is in tests/conftest.py")


def pytest_collection_modifyitems(config, items):
    names = {item.path.name: set() for item in items}
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        names[item.path.name].add(name)
        if item.path.name in SLOW_MODULES or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    # A renamed slow test would silently join the fast tier: say so where its module was collected.
    for name in sorted(SLOW_TESTS):
        module = name.split("::")[0]
        if module in names and name not in names[module]:
            warnings.warn(pytest.PytestWarning(f"SLOW_TESTS in tests/conftest.py names {name}, which no longer exists"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return tiny_models.build_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def sampler_defaults_llama_dir(llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama's weights with a checkpoint's own sampler defaults (`tiny_models.CHECKPOINT_SAMPLERS`)."""
    return tiny_models.with_sampler_defaults(llama_dir, tmp_path_factory.mktemp("models") / "tiny-llama-samplers")


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


@pytest.fixture(scope="session")
def family_folder(tmp_path_factory) -> Callable[[str], Path]:
    """`family_folder(name)`: the tiny checkpoint `fixtures/vlm_families.FAMILIES[name]` builds, built on first use
    and then shared by every module of the session. Read it, never write into it: a test that varies a
    checkpoint copies the folder (`shutil.copytree`) and changes its copy."""
    from fixtures import vlm_families  # imports the extension: only for the modules that ask

    root = tmp_path_factory.mktemp("vlm_families")
    return functools.cache(lambda name: vlm_families.FAMILIES[name](root / name))


@pytest.fixture
def llama(host, llama_dir):
    """The tiny Llama loaded into the host, as `server.py --model` would."""
    host.load(llama_dir)
    return host


@pytest.fixture
def host():
    """Restores the host's global state after a test that loads models or extensions."""
    from fixtures import host_helpers

    snapshot = host_helpers.snapshot()
    yield host_helpers
    host_helpers.restore(snapshot)


@pytest.fixture(scope="module")
def llama_api(llama_dir):
    """A live OpenAI-compatible API on the tiny Llama (one server per test module)."""
    from fixtures import api_helpers

    with api_helpers.serving(llama_dir) as api:
        yield api


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (one per test module)."""
    from fixtures.browser_helpers import chromium

    with chromium() as b:
        yield b
