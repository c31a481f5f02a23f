"""The chat UI in Debian's Chromium through Playwright: a real server, a real page.

- `python server.py --model <tiny Llama> --listen-port P` serves the UI and a chat turn streams a reply.
- Text that looks like HTML (`<script>`, `<img onerror>`, a PNG data-URL tag, a half tag) typed by
  the user, loaded from a history file, or produced as model output is shown as text and never runs:
  each payload would set `window.__pwned`, and the test asserts it stayed 0.
Screenshots go to test-artifacts/. The helpers here are shared with test_browser_multimodal.py.
"""
from __future__ import annotations

import html
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVER_START_SECONDS = 120
REPLY_SECONDS = 60

PAYLOADS = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    '<img src="data:image/png;base64,iVBORw0KGgo=" onerror="window.__pwned = 3">',
    '<svg onload="window.__pwned = 4"></svg>',
    '<img src="x" onerror="window.__pwned = 5"',  # a half tag
    "${window.__pwned = 6} {{value}}",
]
PAYLOAD = " ".join(PAYLOADS)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} "
                                "(apt-get install chromium, or set CHROMIUM_PATH)")


# -- Helpers (also used by test_browser_multimodal.py) ------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, proc: subprocess.Popen | None, log: Path | None, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:] if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {seconds} s:\n{log.read_text()[-4000:] if log else ''}")


@contextmanager
def server_process(args: list[str], log: Path):
    """`python server.py ARGS --listen-port P` as a subprocess; yields its URL, stops it afterwards."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
               PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "server.py", *args, "--listen-port", str(port)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_http(url, proc, log, SERVER_START_SECONDS)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_chat(browser, url: str):
    """A fresh browser session on the chat page, with a `window.__pwned` flag set to 0."""
    context = browser.new_context(viewport={"width": 1200, "height": 1000})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#chat-input textarea", timeout=30_000)
    page.evaluate("window.__pwned = 0")
    return page


def record_replies(page) -> None:
    """Collect every distinct text the last assistant message shows (to see the reply stream)."""
    page.evaluate("""() => {
        window.__replies = [];
        new MutationObserver(() => {
            const bots = document.querySelectorAll('#chat-history .assistant');
            const text = bots.length ? bots[bots.length - 1].innerText : null;
            if (text !== null && window.__replies[window.__replies.length - 1] !== text) window.__replies.push(text);
        }).observe(document.querySelector('#chat-display'), {subtree: true, childList: true, characterData: true});
    }""")


def wait_for_reply(page, turns: int, seconds: float = REPLY_SECONDS) -> str:
    """Waits until the chat holds `turns` replies and the last one stopped changing; returns its text.

    Fails at once, with the message, when the chat shows an error notice instead.
    """
    page.wait_for_function(
        """(turns) => {
            const bots = document.querySelectorAll('#chat-history .assistant');
            if (document.querySelector('#chat-history .notice')) return true;
            return bots.length >= turns && !bots[bots.length - 1].innerText.includes('Is typing');
        }""", arg=turns, timeout=seconds * 1000)
    notice = page.locator("#chat-history .notice")
    if notice.count():
        raise AssertionError(f"the chat shows an error instead of reply {turns}: {notice.first.inner_text()}")
    last, stable_since = None, time.monotonic()
    while time.monotonic() - stable_since < 1.5:
        text = page.locator("#chat-history .assistant").last.inner_text()
        if text != last:
            last, stable_since = text, time.monotonic()
        time.sleep(0.25)
    return last


def send(page, text: str, with_enter: bool = True) -> None:
    box = page.locator("#chat-input textarea")
    box.fill(text)
    if with_enter:
        box.press("Enter")
    else:
        page.click("#Generate")


def assert_nothing_ran(page) -> None:
    assert page.evaluate("window.__pwned") == 0, "a payload in the chat ran"
    # The only elements in the history: message rows and images from JPEG data URLs.
    stray = page.evaluate("""() => Array.from(document.querySelectorAll('#chat-history *'))
        .filter((e) => !(e.tagName === 'DIV' ||
                         (e.tagName === 'IMG' && e.getAttribute('src').startsWith('data:image/jpeg;base64,'))))
        .map((e) => e.outerHTML)""")
    assert stray == []
    handlers = page.evaluate("""() => Array.from(document.querySelectorAll('#chat-history *'))
        .flatMap((e) => Array.from(e.attributes).map((a) => a.name)).filter((n) => n.startsWith('on'))""")
    assert handlers == []


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


# -- The real server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_server(llama_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-server")
    settings = folder / "settings.yaml"
    settings.write_text("max_new_tokens: 12\nban_eos_token: true\ndo_sample: false\n")
    with server_process(["--model", str(llama_dir), "--settings", str(settings)], folder / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


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
        host.load(llama_dir, ["planting"], settings={"max_new_tokens": 4})
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
