"""The newcomer's path: `python server.py` with no flags serves the shipped demo in a real browser.

No --model, no --extensions: the server loads `models/tiny-llava-shapes` from the default settings,
turns the multimodal extension on by itself, and answers a picture by naming its colour and shape.
(A settings file asks for greedy decoding, so the answer checked is deterministic.)
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from modules import shared
from tests.browser_helpers import CHROMIUM, chromium, open_chat, screenshot, send, server_process, wait_for_reply
from tests.conftest import ROOT
from tools.train_demo_model import render_shape

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    assert (ROOT / "models" / shared.DEMO_MODEL).is_dir()
    folder = tmp_path_factory.mktemp("demo-server")
    settings = folder / "settings.yaml"
    settings.write_text("do_sample: false\n")
    with server_process(["--settings", str(settings)], folder / "server.log") as url:
        yield url


@pytest.mark.parametrize("colour, shape", [("red", "circle"), ("blue", "square")])
def test_no_flags_starts_the_demo_and_it_names_the_picture(demo_server, tmp_path, colour, shape):
    picture = tmp_path / f"{colour}-{shape}.png"
    render_shape(colour, shape, random.Random(7), width=200, height=160).save(picture)
    with chromium() as browser:
        page = open_chat(browser, demo_server)
        page.set_input_files("#multimodal-images input[type=file]", [str(picture)])
        page.wait_for_function("document.querySelectorAll('#multimodal-preview img').length === 1", timeout=30_000)
        send(page, "What is in this picture?")
        reply = wait_for_reply(page, 1)
        screenshot(page, f"browser_demo_{colour}_{shape}.png")
        page.context.close()
    assert colour in reply.lower() and shape in reply.lower(), reply
