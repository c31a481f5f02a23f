"""Hostile image input through the UI's generate handler: a notice in the chat, the history kept,
and a normal message right after works (the multimodal extension on the tiny llava-hf fixture)."""
from __future__ import annotations

import sys

import pytest
from PIL import Image

from modules import shared, ui_chat
from tests.multimodal_fake_pipeline import encoded, noise_image, solid_image, tag_of_bytes
from tests.test_multimodal_hostile import (animated_gif, exif_rotated, palette_with_transparency, png_header_only,
                                           truncated_jpeg)


@pytest.fixture
def llava_ui(host, llava_dir):
    host.load(llava_dir, ["multimodal"])
    shared.gradio["extension_inputs"] = {"message_images": None}
    yield host
    shared.gradio.pop("extension_inputs", None)


def params() -> list:
    return [8, 0.0, 1.0, 1024]  # max_new_tokens, temperature (0: greedy), top_p, truncation_length


def send(text: str, history: dict, images=None) -> tuple[str, dict]:
    outputs = list(ui_chat.generate(text, history, *params(), images))
    return outputs[-1]


def good_turn_works(history: dict) -> None:
    good = encoded(noise_image(7, (40, 30)), "PNG")
    html, after = send(f"{tag_of_bytes(good)}What is this?", history)
    assert len(after["internal"]) == len(history["internal"]) + 1
    assert after["internal"][-1][1], "a reply arrived"
    assert "Generation failed" not in html


def sixteen_bit() -> bytes:
    return encoded(Image.new("I;16", (20, 20), 4000), "PNG")


BAD_TAGS = {
    "bad base64 length": '<img src="data:image/jpeg;base64,AAAAA">',
    "bad base64 characters": '<img src="data:image/jpeg;base64,AB=CDEFG">',
    "not an image": tag_of_bytes(b"hello, I am not an image"),
    "truncated jpeg": tag_of_bytes(truncated_jpeg()),
    "too many pixels": tag_of_bytes(png_header_only(20000, 20000)),
}

ODD_BUT_VALID = {
    "png behind the jpeg label": lambda: encoded(noise_image(1), "PNG"),
    "webp": lambda: encoded(noise_image(2), "WEBP"),
    "gif": lambda: encoded(solid_image((0, 200, 0)), "GIF"),
    "animated gif": animated_gif,
    "1x1": lambda: encoded(solid_image((9, 9, 9), (1, 1)), "PNG"),
    "10000x10": lambda: encoded(solid_image((200, 9, 9), (10000, 10)), "PNG"),
    "cmyk": lambda: encoded(Image.new("CMYK", (20, 20), (0, 255, 255, 0)), "JPEG"),
    "p with transparency": palette_with_transparency,
    "la": lambda: encoded(Image.new("LA", (20, 20), (128, 100)), "PNG"),
    "i;16": sixteen_bit,
    "exif rotated": exif_rotated,
}


@pytest.mark.parametrize("case", list(BAD_TAGS))
def test_a_bad_image_in_the_text_becomes_a_notice(llava_ui, case):
    history = {"internal": [["Hi", "Hello."]], "visible": [["Hi", "Hello."]]}
    html, after = send(f"{BAD_TAGS[case]} what is this?", history)
    assert after == history, "the history is kept as it was"
    assert "Generation failed" in html and "image" in html
    good_turn_works(history)


@pytest.mark.parametrize("case", ["not an image", "truncated jpeg", "zero bytes", "too many pixels"])
def test_a_bad_uploaded_file_becomes_a_notice(llava_ui, tmp_path, case):
    data = {"not an image": b"hello", "truncated jpeg": truncated_jpeg(), "zero bytes": b"",
            "too many pixels": png_header_only(20000, 20000)}[case]
    path = tmp_path / "upload.jpg"
    path.write_bytes(data)
    history = {"internal": [], "visible": []}
    html, after = send("What is this?", history, [str(path)])
    assert after == history and "Generation failed" in html
    good_turn_works(history)


@pytest.mark.parametrize("case", list(ODD_BUT_VALID))
def test_odd_but_valid_uploads_are_answered(llava_ui, tmp_path, case):
    path = tmp_path / "upload.bin"
    path.write_bytes(ODD_BUT_VALID[case]())
    html, after = send("What is this?", {"internal": [], "visible": []}, [str(path)])
    assert "Generation failed" not in html
    from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, decode_image_bytes, tag_b64_to_image

    match = IMAGE_TAG_RE.match(after["internal"][-1][0])
    assert match and after["internal"][-1][1]
    stored = tag_b64_to_image(match.group("data"))
    sent = decode_image_bytes(path.read_bytes())
    assert stored.mode == "RGB" and stored.tobytes() == sent.tobytes(), "the model sees the pixels sent"


def test_more_images_than_allowed_is_a_notice(llava_ui, tmp_path):
    script = sys.modules["extensions.multimodal.script"]
    script.params["max_images_per_prompt"] = 2
    script.params["add_all_images_to_prompt"] = True
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"{i}.png")
        paths[-1].write_bytes(encoded(noise_image(i), "PNG"))
    html, after = send("Compare", {"internal": [], "visible": []}, [str(p) for p in paths])
    assert "Generation failed" in html and "2" in html and after["internal"] == []
    good_turn_works({"internal": [], "visible": []})


def test_a_prompt_that_cannot_fit_is_a_notice(llava_ui):
    good = tag_of_bytes(encoded(noise_image(5), "PNG"))
    history = {"internal": [], "visible": []}
    outputs = list(ui_chat.generate(f"{good} " + "word " * 50, history, 40, 0.0, 1.0, 64, None))
    html, after = outputs[-1]
    assert "Generation failed" in html or "Removed" in html
    good_turn_works(history)


def test_images_dropped_by_truncation_are_told_in_the_chat(llava_ui):
    script = sys.modules["extensions.multimodal.script"]
    script.params["add_all_images_to_prompt"] = True
    first, second = (tag_of_bytes(encoded(noise_image(i), "PNG")) for i in (11, 12))
    history = {"internal": [], "visible": []}
    # 16 tokens per image: both images and the text need ~44 tokens; 30 fit, so the first image goes.
    html, after = list(ui_chat.generate(f"{first}{second}What?", history, 6, 0.0, 1.0, 36, None))[-1]
    assert after["internal"][-1][1] and "⚠ Removed 1 image(s)" in after["visible"][-1][1]
    assert "Removed" not in after["internal"][-1][1], "the notice is for the user, not the model"
    assert "Removed 1 image(s)" in html
