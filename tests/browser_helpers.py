"""Shared helpers for the browser tests: a real server process, Debian's Chromium through Playwright,
and page actions (send, wait for a reply, assert no payload ran, screenshots to test-artifacts/)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tools.vllm_cpu.process import free_port


ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVER_START_SECONDS = 120
REPLY_SECONDS = 120  # generous: CI machines may be slow and shared

PAYLOADS = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    '<img src="data:image/png;base64,iVBORw0KGgo=" onerror="window.__pwned = 3">',
    '<svg onload="window.__pwned = 4"></svg>',
    '<img src="x" onerror="window.__pwned = 5"',  # a half tag
    "${window.__pwned = 6} {{value}}",
]
PAYLOAD = " ".join(PAYLOADS)


# -- Helpers (also used by test_browser_multimodal.py) ------------------------------------------

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
    # The only elements in the history: message rows and images from JPEG or PNG data URLs.
    stray = page.evaluate(r"""() => Array.from(document.querySelectorAll('#chat-history *'))
        .filter((e) => !(e.tagName === 'DIV' ||
                         (e.tagName === 'IMG' && /^data:image\/(jpeg|png);base64,/.test(e.getAttribute('src')))))
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


@contextmanager
def greedy_server(model_dir: Path, folder: Path, max_new_tokens: int):
    """`server.py --model model_dir` with greedy decoding and short replies, each token an update of the
    page (a tiny model's reply takes a few milliseconds: within one update at the default 50 a second);
    yields its URL."""
    settings = folder / "settings.yaml"
    settings.write_text(f"max_new_tokens: {max_new_tokens}\nban_eos_token: true\ndo_sample: false\n"
                        "max_updates_second: 0\n")
    with server_process(["--model", str(model_dir), "--settings", str(settings)], folder / "server.log") as url:
        yield url
