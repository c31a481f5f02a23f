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
from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
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
    from extensions.multimodal.core.ui import preview

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
    assert IMAGE_TAG_RE.sub("[IMG]", visible_user) == (
        "[IMG]<span class=\"image-tokens\">16 tokens</span>\nCompare [IMG]<span class=\"image-tokens\">16 tokens</span> "
        "with that."), "each picture's cost follows its tag (visible only)"
    assert tag_payloads(history["internal"][0][0]) == tags
    assert len(re.findall(r'<img src="gradio_api/file=[^"]+/picture\.png"', display)) == 2 and reply  # PNGs stay PNG
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


# -- Each picture's cost, and the budget choice -----------------------------------------------------

IDS_RECORDER = '''
seen = []

def tokenizer_modifier(state, prompt, input_ids, input_embeds):
    seen.append(input_ids[0].tolist())  # loaded after multimodal: the ids the model is given
    return prompt, input_ids, input_embeds
'''


def load_with_recorder(host, model_dir, tmp_path):
    import extensions as extensions_package

    folder = tmp_path / "ids_recorder"
    folder.mkdir()
    (folder / "script.py").write_text(IDS_RECORDER)
    extensions_package.__path__.append(str(tmp_path))
    try:
        host.load(model_dir, ["multimodal", "ids_recorder"])
        import extensions.ids_recorder.script as recorder
    finally:
        extensions_package.__path__.remove(str(tmp_path))
    ui_chat.create_interface()
    return recorder


def captions(visible: str) -> list[int]:
    from modules.html_generator import IMAGE_CAPTION_RE

    return [int(m.group("tokens")) for m in IMAGE_CAPTION_RE.finditer(visible)]


def image_positions(ids: list[int]) -> int:
    config = shared.model.config
    return ids.count(getattr(config, "image_token_index", None) or config.image_token_id)


def test_each_picture_shows_the_tokens_the_model_received(host, llava_dir, tmp_path):
    recorder = load_with_recorder(host, llava_dir, tmp_path)
    red = write_png(tmp_path / "red.png", (220, 20, 20))
    wide = str(tmp_path / "wide.png")
    Image.new("RGB", (96, 20), (20, 20, 220)).save(wide)
    display, history = list(ui_chat.generate("Compare them.", chat.new_history(), *params(4), [red, wide]))[-1]
    shown = captions(history["visible"][0][0])
    assert len(shown) == 2 and sum(shown) == image_positions(recorder.seen[-1])
    # Hugging Face's own processor gives each picture the same count.
    processor = host.hf_processor()
    for path, tokens in zip([red, wide], shown):
        ids = processor(text="<image>", images=[Image.open(path)], return_tensors="pt")["input_ids"][0].tolist()
        assert image_positions(ids) == tokens
    assert captions(history["internal"][0][0]) == [], "the model's text keeps its tags as they are"
    assert tag_payloads(history["internal"][0][0]) == tag_payloads(history["visible"][0][0])
    assert display.count('data-caption="') == 2
    # A turn with no picture leaves the earlier captions alone and adds none.
    display, history = list(ui_chat.generate("And?", history, *params(4), None))[-1]
    assert captions(history["visible"][0][0]) == shown and captions(history["visible"][1][0]) == []


def test_the_budget_choice_is_kept_between_messages_and_is_no_content(llava):
    interface = ui_chat.create_interface()
    budget = shared.gradio["extension_options"]["image_budget"]
    assert isinstance(budget, gr.Radio) and budget.elem_id == "multimodal-budget" and budget.value == "default"
    assert [value for _, value in budget.choices] == ["default", "low", "high"]
    config = interface.get_config_file()
    for send in config["dependencies"]:
        if interface.fns[send["id"]].fn is ui_chat.take_inputs:  # never read as message content, never cleared
            assert budget._id not in send["inputs"] and budget._id not in send["outputs"]
    state = ui_chat.state_from_values(chat.new_history(), *params(), None, "low")
    assert state["image_budget"] == "low" and state["message_images"] is None
    assert list(ui_chat.generate("", chat.new_history(), *params(), None, "low"))[-1][1] == chat.new_history()


def test_a_pixel_count_setting_is_a_fourth_choice_the_radio_starts_at():
    from extensions.multimodal.core.ui import budget_choices

    assert budget_choices("low") == [("default", "default"), ("low", "low"), ("high", "high")]
    assert budget_choices(300000)[-1] == ("300000 pixels (the setting)", "300000")


def test_the_budget_chosen_for_a_message_reaches_the_model(host, family_folder, tmp_path):
    """Qwen2-VL has a budget knob (pixels per picture): "high" reads a large picture with more tokens,
    and each caption is what the model was given."""
    recorder = load_with_recorder(host, family_folder("qwen2_vl"), tmp_path)
    picture = str(tmp_path / "noise.png")
    Image.effect_noise((200, 160), 60).convert("RGB").save(picture)
    shown = {}
    for level in ("default", "high"):
        history = list(ui_chat.generate("What?", chat.new_history(), *params(), [picture], level))[-1][1]
        shown[level] = captions(history["visible"][0][0])
        assert shown[level] == [image_positions(recorder.seen[-1])], level
    assert shown["high"][0] > shown["default"][0]


def test_a_picture_left_out_to_fit_gets_no_caption(llava, tmp_path):
    ui_chat.create_interface()
    red, blue = write_png(tmp_path / "red.png", (220, 20, 20)), write_png(tmp_path / "blue.png", (20, 20, 220))
    # 16 tokens per picture: both and the text need ~44 tokens; 30 fit, so the first picture goes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = list(ui_chat.generate("What?", chat.new_history(), 6, 0.0, 1.0, 36, [red, blue]))[-1][1]
    visible = history["visible"][0][0]
    assert "Removed 1 image(s)" in history["visible"][0][1]
    assert IMAGE_TAG_RE.sub("[IMG]", visible) == '[IMG]\n[IMG]<span class="image-tokens">16 tokens</span>\nWhat?'
