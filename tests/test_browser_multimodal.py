"""The multimodal image input in Debian's Chromium: `python server.py --model <tiny llava-hf>`.

An image uploaded in the page shows in the history and a reply arrives; several images at once
(upload and paste) attach in order at `<image>` markers, the rest before the text; the input clears
after sending; two browser sessions never see each other's pending images.
Screenshots go to test-artifacts/.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urljoin

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from fixtures.browser_helpers import (greedy_server, CHROMIUM, assert_nothing_ran, open_chat, screenshot, send,
                                     wait_for_reply)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

FILE_INPUT = "#multimodal-images input[type=file]"
RED, GREEN, BLUE = (220, 20, 20), (20, 200, 20), (20, 20, 220)

# A paste (Ctrl+V) of a blue PNG into the chat textbox, as the browser delivers it.
PASTE_BLUE = """async () => {
    const canvas = Object.assign(document.createElement('canvas'), {width: 40, height: 24});
    const context = canvas.getContext('2d');
    context.fillStyle = 'rgb(20, 20, 220)';
    context.fillRect(0, 0, 40, 24);
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, 'image/png'));
    const data = new DataTransfer();
    data.items.add(new File([blob], 'pasted.png', {type: 'image/png'}));
    document.querySelector('#chat-input textarea').dispatchEvent(
        new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
}"""

# The centre pixel of each image in the last user message, as the page decoded it.
IMAGE_COLORS = """async () => {
    const users = document.querySelectorAll('#chat-history .user');
    const images = Array.from(users[users.length - 1].querySelectorAll('img'));
    await Promise.all(images.map((img) => img.decode()));
    return images.map((img) => {
        const size = {width: img.naturalWidth, height: img.naturalHeight};
        const canvas = Object.assign(document.createElement('canvas'), size);
        const context = canvas.getContext('2d');
        context.drawImage(img, 0, 0);
        return Array.from(context.getImageData(img.naturalWidth >> 1, img.naturalHeight >> 1, 1, 1).data.slice(0, 3));
    });
}"""


def close(color, expected, tolerance=30) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(color, expected))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pictures")
    paths = {}
    for name, color in (("red", RED), ("green", GREEN)):
        paths[name] = folder / f"{name}.png"
        Image.new("RGB", (40, 24), color).save(paths[name])
    return paths


@pytest.fixture(scope="module")
def llava_server(llava_dir, tmp_path_factory):
    """The real server; the multimodal extension turns on by itself for an image-text model."""
    folder = tmp_path_factory.mktemp("llava-server")
    with greedy_server(llava_dir, folder, max_new_tokens=6) as url:
        yield url


def pending_count(page) -> int:
    return page.locator("#multimodal-preview img").count()


def wait_pending(page, count: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('#multimodal-preview img').length === {count}",
                           timeout=30_000)


def test_an_uploaded_image_shows_in_the_history_and_a_reply_arrives(llava_server, browser, pictures):
    page = open_chat(browser, llava_server)
    assert page.get_by_label("Embed all images, not only the last one").count() == 1
    page.set_input_files(FILE_INPUT, [str(pictures["red"])])
    wait_pending(page, 1)
    send(page, "What is in the picture?")
    reply = wait_for_reply(page, 1)
    assert reply.strip() and "Generation failed" not in page.inner_text("#chat-history")
    user = page.locator("#chat-history .user").first
    source = user.locator("img").first.get_attribute("src")
    assert source.endswith(".png") and served_bytes(page, source) == pictures["red"].read_bytes()  # as sent
    assert user.text_content().strip() == "What is in the picture?"
    assert [close(c, RED) for c in page.evaluate(IMAGE_COLORS)] == [True]
    # The input cleared after sending: nothing pending, and the next message carries no image.
    wait_pending(page, 0)
    assert "red.png" not in page.inner_text("#multimodal-images")
    screenshot(page, "browser_multimodal_image_in_history.png")
    send(page, "And now?")
    wait_for_reply(page, 2)
    assert page.locator("#chat-history .user").nth(1).locator("img").count() == 0
    assert_nothing_ran(page)
    page.context.close()


def served_bytes(page, source: str) -> bytes:
    """The bytes the page loads for an image source (relative to the page)."""
    return page.request.get(urljoin(page.url, source)).body()


def test_a_text_turn_after_a_large_photo_sends_the_page_little(llava_server, browser, tmp_path):
    """The chat is rendered again at every streamed update; the page loads a picture once, by its address,
    not its megabytes at every update (as data URLs did: tens of megabytes a turn with one photo)."""
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (900, 1200, 3), dtype=np.uint8)).save(photo)
    assert photo.stat().st_size > 3_000_000
    page = open_chat(browser, llava_server)
    page.set_input_files(FILE_INPUT, [str(photo)])
    wait_pending(page, 1)
    send(page, "What is in the picture?")
    wait_for_reply(page, 1)
    source = page.locator("#chat-history .user img").first.get_attribute("src")
    assert served_bytes(page, source) == photo.read_bytes()
    received = []
    network = page.context.new_cdp_session(page)
    network.send("Network.enable")
    network.on("Network.dataReceived", lambda event: received.append(event["dataLength"]))
    send(page, "And now?")
    wait_for_reply(page, 2)
    assert 0 < sum(received) < 300_000, f"{sum(received)} bytes for a text turn of a few tokens"
    assert_nothing_ran(page)
    page.context.close()


def test_several_images_by_upload_and_paste_attach_in_order(llava_server, browser, pictures):
    page = open_chat(browser, llava_server)
    page.set_input_files(FILE_INPUT, [str(pictures["red"]), str(pictures["green"])])
    wait_pending(page, 2)
    page.evaluate(PASTE_BLUE)
    wait_pending(page, 3)
    send(page, "Compare <image> with the others.")
    wait_for_reply(page, 1)
    assert "Generation failed" not in page.inner_text("#chat-history")
    colors = page.evaluate(IMAGE_COLORS)
    # The first image takes the marker; the others go before the text, in order.
    assert len(colors) == 3
    assert close(colors[0], GREEN) and close(colors[1], BLUE) and close(colors[2], RED), colors
    assert page.locator("#chat-history .user").first.text_content().strip() == "Compare  with the others."
    wait_pending(page, 0)
    screenshot(page, "browser_multimodal_several_images.png")
    page.context.close()


def test_sessions_do_not_share_pending_images(llava_server, browser, pictures):
    first, second = open_chat(browser, llava_server), open_chat(browser, llava_server)
    first.set_input_files(FILE_INPUT, [str(pictures["green"])])
    wait_pending(first, 1)
    assert pending_count(second) == 0
    send(second, "Hello from the second session")
    wait_for_reply(second, 1)
    assert second.locator("#chat-history .user img").count() == 0
    assert pending_count(first) == 1, "the first session's image is still pending"
    first.context.close()
    second.context.close()


def upload_until_listed(page, path: Path) -> None:
    """Uploads `path` until the image input lists it: on a loaded machine the upload of a file that is no
    picture was twice never listed within two minutes (the upload event lost); a user would drop it again."""
    listed = f"document.querySelector('#multimodal-images').innerText.includes({path.name!r})"
    for _ in range(3):
        page.set_input_files(FILE_INPUT, [str(path)])
        try:
            page.wait_for_function(listed, timeout=60_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the image input never listed {path.name}")


def test_a_broken_image_gives_a_notice_and_the_message_comes_back(llava_server, browser, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    page = open_chat(browser, llava_server)
    upload_until_listed(page, broken)
    send(page, "What is in this one?")
    page.wait_for_selector("#chat-history .notice", timeout=120_000)
    assert "image" in page.inner_text("#chat-history .notice")
    assert page.locator("#chat-history .user").count() == 0, "no half turn in the history"
    page.wait_for_function("document.querySelector('#chat-input textarea').value === 'What is in this one?'",
                           timeout=30_000)
    # Nothing sent is lost: the picture is back in the input, for the user to remove or replace.
    listed = "document.querySelector('#multimodal-images').innerText.includes('broken')"  # "broken" ".png" apart
    page.wait_for_function(listed, timeout=30_000)
    screenshot(page, "browser_multimodal_broken_image.png")
    page.locator("#multimodal-images button[aria-label='Clear']").click()
    page.wait_for_function(f"!{listed}", timeout=30_000)
    send(page, "Hello")  # the session still works; the new render replaces the notice
    page.wait_for_function("!document.querySelector('#chat-history .notice')", timeout=60_000)
    wait_for_reply(page, 1)
    assert_nothing_ran(page)
    page.context.close()
