"""Picture costs, the picture budget choice and the context meter in Debian's Chromium, on the tiny Qwen2-VL
checkpoint (`fixtures/vlm_families.py`), a family with a budget knob: "high" reads a large picture with more tokens.

After a turn each picture shows "N tokens" under it and the meter under the chat "Context: X / Y tokens"; the
budget radio is no message content (choosing one and pressing Enter sends nothing) and keeps its value; with
a small truncation length, pictures in turns 1, 2 and 3 at "high" leave turn 1's out and the reply says so.
Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from fixtures.browser_helpers import CHROMIUM, assert_nothing_ran, greedy_server, open_chat, screenshot, send, wait_for_reply

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

FILE_INPUT = "#multimodal-images input[type=file]"
METER = re.compile(r"Context: (\d+) / (\d+) tokens")


@pytest.fixture(scope="module")
def qwen_server(family_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen-server")
    with greedy_server(family_folder("qwen2_vl"), folder, max_new_tokens=4) as url:
        yield url


@pytest.fixture(scope="module")
def second_server(family_folder, tmp_path_factory):
    """A server of its own for the truncation test (its first page changes the truncation length)."""
    folder = tmp_path_factory.mktemp("qwen-server-2")
    with greedy_server(family_folder("qwen2_vl"), folder, max_new_tokens=4) as url:
        yield url


@pytest.fixture(scope="module")
def noise_pictures(tmp_path_factory) -> list[str]:
    """Three different 200x160 pictures: larger than the checkpoint's default reads (64 tokens at most)."""
    folder = tmp_path_factory.mktemp("pictures")
    paths = []
    for i in range(3):
        paths.append(str(folder / f"noise{i}.png"))
        Image.effect_noise((200, 160), 60 + 10 * i).convert("RGB").save(paths[-1])
    return paths


def send_with_picture(page, picture: str, text: str, turns: int) -> str:
    page.set_input_files(FILE_INPUT, [picture])
    page.wait_for_function("document.querySelectorAll('#multimodal-preview img').length === 1", timeout=120_000)
    send(page, text)
    return wait_for_reply(page, turns)


def captions(page) -> list[str]:
    """Each picture's caption in the user messages, as the browser draws it (a CSS ::after)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#chat-history .user .picture'))
        .map((e) => getComputedStyle(e, '::after').content.replace(/^"|"$/g, ''))""")


def meter(page) -> tuple[int, int]:
    page.wait_for_function("/Context: \\d+ \\/ \\d+ tokens/.test(document.querySelector('#context-meter').innerText)",
                           timeout=120_000)
    found = METER.search(page.inner_text("#context-meter"))
    return int(found.group(1)), int(found.group(2))


def choose_budget(page, level: str) -> None:
    page.locator("#multimodal-budget label", has_text=level).click()
    assert page.locator(f"#multimodal-budget input[value={level}]").is_checked()


def test_costs_budget_choice_and_context_meter(qwen_server, browser, noise_pictures):
    page = open_chat(browser, qwen_server)
    assert page.locator("#multimodal-budget input[value=default]").is_checked()
    _, limit = meter(page)
    send_with_picture(page, noise_pictures[0], "What is it?", 1)
    page.wait_for_function("document.querySelectorAll('#chat-history .user .picture').length === 1", timeout=120_000)
    [default_cost] = captions(page)
    assert re.fullmatch(r"\d+ tokens", default_cost), default_cost
    used, shown_limit = meter(page)
    assert shown_limit == limit and used > int(default_cost.split()[0])
    assert page.locator("#chat-history .user").first.text_content().strip() == "What is it?"
    # A budget choice alone is no message: Enter on an empty textbox sends nothing.
    choose_budget(page, "high")
    send(page, "")
    time.sleep(2)
    assert page.locator("#chat-history .user").count() == 1
    send_with_picture(page, noise_pictures[0], "And at high?", 2)
    page.wait_for_function("document.querySelectorAll('#chat-history .user .picture').length === 2", timeout=120_000)
    first, high_cost = captions(page)
    assert first == default_cost and int(high_cost.split()[0]) > int(default_cost.split()[0])
    assert page.locator("#multimodal-budget input[value=high]").is_checked(), "the choice stays after a send"
    screenshot(page, "browser_image_budget_costs.png")
    assert_nothing_ran(page)
    page.context.close()


def set_truncation_length(page, value: int) -> None:
    """Types `value` into the slider's number box, as a user does, until the meter shows it: now and then
    (seen in full-suite runs, on a quiet machine too) the box takes the text but the meter never follows,
    and a user would type the value again."""
    page.get_by_text("Parameters", exact=True).click()
    box = page.get_by_label("number input for truncation_length")
    shown = f"document.querySelector('#context-meter').innerText.includes('/ {value} tokens')"
    for attempt in range(3):
        if attempt:  # away and back: typing the same value again would be no change
            box.fill(str(value + 64))
            box.press("Enter")
        box.fill(str(value))
        box.press("Enter")
        box.press("Tab")
        try:
            page.wait_for_function(shown, timeout=30_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the context meter never showed the truncation length {value}")


def test_a_picture_dropped_to_fit_is_named_by_its_turn(second_server, browser, noise_pictures):
    """At "high" each picture takes more than the host's measure (at the setting's budget) counts, so the
    host keeps all three turns and the extension leaves out the oldest picture: turn 1's."""
    page = open_chat(browser, second_server)
    choose_budget(page, "high")
    set_truncation_length(page, 320)
    for turn, picture in enumerate(noise_pictures, start=1):
        reply = send_with_picture(page, picture, f"Picture {turn}?", turn)
    assert "Removed 1 image(s)" in reply and "the picture from turn 1 was left out" in reply
    used, limit = meter(page)
    assert limit == 320 and used <= 320
    screenshot(page, "browser_image_budget_dropped.png")
    assert_nothing_ran(page)
    page.context.close()
