"""The multimodal image input's wiring, and images sent through the chat UI's handler (no browser).

The tiny llava-hf fixture with the real multimodal extension: images given as file paths (what
the image input hands over) end up as image tags in the visible history, in order.
"""
from __future__ import annotations

import base64
import io
import json
import re
import warnings

import gradio as gr
import pytest
from PIL import Image

from modules import chat, shared, ui_chat
from extensions.multimodal.image_codec import IMAGE_TAG_RE
from tests.multimodal_fake_pipeline import tag_payloads


@pytest.fixture
def llava(host, llava_dir):
    host.load(llava_dir, ["multimodal"])
    import extensions.multimodal.script as script

    return script


def params(max_new_tokens: int = 4) -> list:
    return [max_new_tokens, 0.0, 1.0, shared.settings["truncation_length"]]


def write_png(path, color) -> str:
    Image.new("RGB", (40, 24), color).save(path)
    return str(path)


def tag_color(b64: str) -> tuple:
    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    return image.getpixel((image.width // 2, image.height // 2))


def close(color, expected, tolerance=24) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(color, expected))


def test_the_image_input_is_registered_and_cleared_on_send(llava):
    interface = ui_chat.create_interface()
    images = shared.gradio["extension_inputs"]["message_images"]
    assert isinstance(images, gr.File) and images.file_count == "multiple" and images.file_types == ["image"]
    assert images.type == "filepath"
    config = interface.get_config_file()
    sends = [d for d in config["dependencies"] if interface.fns[d["id"]].fn is ui_chat.take_inputs]
    assert len(sends) == 2 and all(images._id in d["inputs"] and images._id in d["outputs"] for d in sends)
    assert all(d["queue"] is False for d in sends)


def test_embed_all_checkbox_is_bound_to_the_param(llava):
    interface = ui_chat.create_interface()
    checkbox = shared.gradio["multimodal_embed_all"]
    assert checkbox.label == "Embed all images, not only the last one"
    change = [d for d in interface.get_config_file()["dependencies"]
              if [checkbox._id, "change"] in [list(t) for t in d["targets"]]]
    assert len(change) == 1
    handler = interface.fns[change[0]["id"]].fn
    handler(True)
    assert llava.params["add_all_images_to_prompt"] is True
    handler(False)
    assert llava.params["add_all_images_to_prompt"] is False


def test_preview_shows_pending_images_in_order():
    from extensions.multimodal.ui import preview

    assert preview(None) == gr.update(value=[], visible=False)
    assert preview(["a.png", "b.png"]) == gr.update(value=["a.png", "b.png"], visible=True)


def test_images_attach_at_markers_then_before_the_text(llava, tmp_path):
    ui_chat.create_interface()
    red = write_png(tmp_path / "red.png", (220, 20, 20))
    blue = write_png(tmp_path / "blue.png", (20, 20, 220))
    outputs = list(ui_chat.generate("Compare <image> with that.", chat.new_history(), *params(4), [red, blue]))
    display, history = outputs[-1]
    visible_user, reply = history["visible"][0]
    tags = tag_payloads(visible_user)
    assert len(tags) == 2
    assert close(tag_color(tags[0]), (20, 20, 220)), "the image left over goes before the text"
    assert close(tag_color(tags[1]), (220, 20, 20)), "the first image takes the <image> marker"
    assert IMAGE_TAG_RE.sub("[IMG]", visible_user) == "[IMG]\nCompare [IMG] with that."
    assert tag_payloads(history["internal"][0][0]) == tags
    assert display.count('<img src="data:image/png;base64,') == 2 and reply  # PNG uploads stay PNG
    assert shared.generation_lock.locked() is False


def test_an_undecodable_image_is_a_notice_and_the_history_is_kept(llava, tmp_path):
    ui_chat.create_interface()
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    history = {"internal": [["Hi", "Hello"]], "visible": [["Hi", "Hello"]]}
    before = json.loads(json.dumps(history))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        display, after = list(ui_chat.generate("What is it?", history, *params(4), [str(broken)]))[-1]
    assert after == before and 'class="notice"' in display and "image" in display
    display, after = list(ui_chat.generate("And now?", after, *params(4), None))[-1]
    assert len(after["internal"]) == 2 and 'class="notice"' not in display
