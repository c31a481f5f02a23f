"""The chat UI in Debian's Chromium through Playwright: a real server, a real page.

- `python server.py --model <tiny Llama> --listen-port P` serves the UI and a chat turn streams a reply.
- Text that looks like HTML (`<script>`, `<img onerror>`, a PNG data-URL tag, a half tag) typed by
  the user, loaded from a history file, or produced as model output is shown as text and never runs:
  each payload would set `window.__pwned`, and the test asserts it stayed 0.
Screenshots go to test-artifacts/. Helpers live in fixtures/browser_helpers.py.
"""
from __future__ import annotations

import html
import json
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from fixtures.browser_helpers import (greedy_server, CHROMIUM, PAYLOAD, assert_nothing_ran, free_port, open_chat, record_replies, screenshot, send, wait_for_http, wait_for_reply)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} "
                                "(apt-get install chromium, or set CHROMIUM_PATH)")


# -- The real server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_server(llama_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-server")
    with greedy_server(llama_dir, folder, max_new_tokens=12) as url:
        yield url


def test_server_serves_the_chat_and_a_reply_streams(llama_server, browser):
    page = open_chat(browser, llama_server)
    for name in ("Generate", "Stop", "Regenerate", "Remove last", "Clear"):
        assert page.get_by_role("button", name=name, exact=True).count() == 1, name
    assert page.get_by_text("Parameters").count() >= 1 and page.get_by_text("Save / load history").count() >= 1
    record_replies(page)
    send(page, "Hello there")
    reply = wait_for_reply(page, 1)
    assert reply.strip()
    assert page.locator("#chat-input textarea").input_value() == "", "the textbox clears on send"
    assert page.locator("#chat-history .user").first.inner_text() == "Hello there"
    streamed = [r for r in page.evaluate("window.__replies") if "Is typing" not in r]
    assert len(streamed) > 2 and all(b.startswith(a) for a, b in zip(streamed, streamed[1:])), streamed
    screenshot(page, "browser_chat_reply.png")
    # The session keeps its history: a second turn appends.
    send(page, "And again", with_enter=False)
    wait_for_reply(page, 2)
    assert page.locator("#chat-history .user").count() == 2
    page.context.close()


@pytest.fixture(scope="module")
def slow_server(llama_dir, tmp_path_factory):
    """Replies of 12 tokens that take about 3 s (fixtures/slow_steps.py)."""
    folder = tmp_path_factory.mktemp("slow-server")
    with greedy_server(llama_dir, folder, max_new_tokens=12,
                       extra_args=("--logits-processors", "fixtures.slow_steps:SlowSteps")) as url:
        yield url


def test_while_a_reply_is_written_a_second_message_and_clear_wait(slow_server, browser):
    """A second message sent before the first reply came is refused with the reason, and stays in the
    textbox; Clear is refused too. The reply then arrives whole, and the kept message sends."""
    page = open_chat(browser, slow_server)
    meter = page.locator("#context-meter").inner_text()
    send(page, "first question", with_enter=False)
    page.wait_for_function("document.querySelector('#chat-history .assistant')?.innerText.includes('Is typing')")
    send(page, "second question")
    page.get_by_text("A reply is still being written").first.wait_for(timeout=10_000)
    assert page.locator("#chat-input textarea").input_value() == "second question"
    page.get_by_role("button", name="Clear", exact=True).click()
    reply = wait_for_reply(page, 1)
    assert reply.strip() and page.locator("#chat-history .user").all_inner_texts() == ["first question"]
    screenshot(page, "browser_chat_reply_pending.png")
    # The send's last step, which frees the session, measures the context: the meter counts the turn.
    page.wait_for_function("(before) => document.querySelector('#context-meter').innerText !== before", arg=meter)
    page.click("#Generate")
    wait_for_reply(page, 2)
    assert page.locator("#chat-history .user").all_inner_texts() == ["first question", "second question"]
    assert page.locator("#chat-input textarea").input_value() == ""
    page.context.close()


def test_user_text_that_looks_like_html_is_shown_as_text(llama_server, browser):
    page = open_chat(browser, llama_server)
    send(page, PAYLOAD)
    wait_for_reply(page, 1)
    assert page.locator("#chat-history .user").first.inner_text() == PAYLOAD
    assert_nothing_ran(page)
    screenshot(page, "browser_chat_html_as_text.png")
    # Remove last puts the text back, still as text.
    page.get_by_role("button", name="Remove last", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#chat-history .user').length === 0")
    assert page.locator("#chat-input textarea").input_value() == PAYLOAD
    assert_nothing_ran(page)
    page.context.close()


def test_two_sessions_keep_their_own_history(llama_server, browser):
    first, second = open_chat(browser, llama_server), open_chat(browser, llama_server)
    send(first, "only in the first session")
    wait_for_reply(first, 1)
    second.reload()
    second.wait_for_selector("#chat-history")
    assert second.locator("#chat-history .message").count() == 0
    first.context.close()
    second.context.close()


# -- Model output and loaded histories (an in-process server, to plant the payloads) -------------

HARNESS = '''
def output_modifier(string, state, is_chat=False):
    return string + " " + PAYLOAD
'''


@pytest.fixture
def planted_server(host, llama_dir, tmp_path, monkeypatch):
    """The UI in this process with a history file and an extension whose output carries the payloads."""
    import extensions as extensions_package
    from modules import chat, shared, ui_chat

    (tmp_path / "ext" / "planting").mkdir(parents=True)
    (tmp_path / "ext" / "planting" / "script.py").write_text(f"PAYLOAD = {PAYLOAD!r}\n" + textwrap.dedent(HARNESS))
    extensions_package.__path__.append(str(tmp_path / "ext"))
    monkeypatch.setattr(chat, "HISTORY_DIR", tmp_path / "histories")
    jpeg = ('<img src="data:image/jpeg;base64,/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRof'
            'Hh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5PTgyPC4zNDL/wAALCAABAAEBAREA/8QAFAABAAAAAAAAAAAAAAAAAAAACf/EABQQAQAA'
            'AAAAAAAAAAAAAAAAAAD/2gAIAQEAAD8AKp//2Q==">')
    history = {"internal": [["q", "a"], ["q2", "a2"]],
               "visible": [[PAYLOAD, PAYLOAD], [html.escape(PAYLOAD) + jpeg, html.escape(PAYLOAD)]]}
    chat.HISTORY_DIR.mkdir()
    (chat.HISTORY_DIR / "planted.json").write_text(json.dumps(history))
    try:
        # The multimodal extension (on a fake pipeline) defines the image tags the chat renders as pictures.
        host.load(llama_dir, ["planting", "multimodal"], argv=["--multimodal-pipeline", "fake-linear"],
                  settings={"max_new_tokens": 4,
                            "multimodal-pipeline_dirs": [str(ROOT / "tests" / "multimodal_pipelines")]})
        interface = ui_chat.create_interface()
        port = free_port()
        interface.queue(default_concurrency_limit=4)
        interface.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                         css=ui_chat.interface_css(), js=ui_chat.interface_js(), footer_links=[])
        try:
            wait_for_http(f"http://127.0.0.1:{port}/", None, None, 60)
            yield f"http://127.0.0.1:{port}/"
        finally:
            interface.close()
            shared.gradio.clear()
    finally:
        extensions_package.__path__.remove(str(tmp_path / "ext"))


def test_model_output_and_loaded_histories_are_shown_as_text(planted_server, browser):
    page = open_chat(browser, planted_server)
    send(page, "Hi")
    reply = wait_for_reply(page, 1)
    assert reply.endswith(PAYLOAD)
    assert_nothing_ran(page)
    page.get_by_text("Save / load history").click()
    page.locator("#saved-histories input").click()
    page.get_by_role("option", name="planted").click()
    page.click("#Load-history")
    page.wait_for_function("document.querySelectorAll('#chat-history .assistant').length === 2")
    messages = page.locator("#chat-history .message")
    # Raw HTML and stored-escaped HTML both show as the same text.
    assert [messages.nth(i).inner_text() for i in range(4)] == [PAYLOAD] * 4
    image = page.locator("#chat-history .user img")
    assert image.count() == 1, "the exact JPEG tag shows as an image"
    assert page.evaluate("(img) => img.complete && img.naturalWidth", image.element_handle()) == 1
    time.sleep(0.5)  # give an onerror handler a chance to have run, had one been attached
    assert_nothing_ran(page)
    screenshot(page, "browser_loaded_history_html_as_text.png")
    page.context.close()
