"""The newcomer's path: `python server.py` with no flags serves the shipped demo in a real browser.

No --model, no --extensions: the server loads `models/tiny-llava-shapes` from the default settings,
turns the multimodal extension on by itself, prints its URL, and answers about uploaded pictures:
one picture; a text-only turn; two pictures in one message; then a fourth picture attached and a question
typed but not sent, which the context meter already counts. The screenshot of that page is the README's
(`docs/demo-chat.png` is copied from `test-artifacts/browser_demo_chat.png`). A settings file asks
for greedy decoding, so the answers checked are deterministic.
"""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from modules import shared
from fixtures.browser_helpers import (
    CHROMIUM,
    chromium,
    open_chat,
    screenshot,
    send,
    server_process,
    wait_for_reply,
)
from tests.conftest import ROOT
from tools.demo_model.chats import TEXT_CHAT
from tools.demo_model.pictures import draw_scene, random_scene

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
METER_JS = "Number((/Context: (\\d+) \\//.exec(document.querySelector('#context-meter').innerText) || [])[1] || -1)"


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    assert (ROOT / "models" / shared.DEMO_MODEL).is_dir()
    folder = tmp_path_factory.mktemp("demo-server")
    settings = folder / "settings.yaml"
    settings.write_text("do_sample: false\n")
    log = folder / "server.log"
    with server_process(["--settings", str(settings)], log) as url:
        yield url, log


def save_picture(folder: Path, kinds: list[tuple[str, str]], seed: int) -> str:
    rng = random.Random(seed)
    path = folder / ("-".join(f"{c}-{s}" for c, s in kinds) + ".png")
    draw_scene(random_scene(rng, kinds=kinds), rng, size=(200, 160)).save(path)
    return str(path)


def attach(page, files: list[str]) -> None:
    page.set_input_files("#multimodal-images input[type=file]", files)
    page.wait_for_function(f"document.querySelectorAll('#multimodal-preview img').length === {len(files)}",
                           timeout=30_000)


def test_no_flags_starts_the_demo_and_it_answers_about_the_pictures(demo_server, tmp_path):
    url, log = demo_server
    assert url.rstrip("/") in log.read_text(), "the server prints its URL"
    red_circle = save_picture(tmp_path, [("red", "circle")], 7)
    blue_square = save_picture(tmp_path, [("blue", "square")], 8)
    with chromium() as browser:
        page = open_chat(browser, url)
        turns = [([red_circle], "What shape is this?"), ([], "What can you do?"),
                 ([red_circle, blue_square], "Which image has the blue shape?")]
        replies = []
        for number, (files, text) in enumerate(turns, start=1):
            if files:
                attach(page, files)
            send(page, text)
            replies.append(wait_for_reply(page, number))
        # The next message, not sent: its picture counts in the meter before Generate, at least what the
        # same-sized pictures above cost (their captions, "N tokens").
        sent = page.evaluate("getComputedStyle(document.querySelector('#chat-history .user .picture'), "
                             "'::after').content")
        cost = int(re.search(r"(\d+) tokens", sent).group(1))
        page.wait_for_function(f"{METER_JS} > 0", timeout=30_000)
        before = page.evaluate(METER_JS)
        attach(page, [save_picture(tmp_path, [("green", "triangle")], 9)])
        page.locator("#chat-input textarea").fill("What color is the shape?")
        page.wait_for_function(f"{METER_JS} >= {before + cost}", timeout=30_000)
        screenshot(page, "browser_demo_chat.png")
        page.context.close()
    assert replies == ["It is a circle.", TEXT_CHAT["What can you do?"], "The second."], replies
