"""The extension through the host: setup without a UI, pipeline choice, chat turns with images.

The oracle for a chat turn is `model.generate(inputs_embeds=...)` called directly with the
embeddings the extension stitched for the same prompt.
"""
from __future__ import annotations

import base64
import logging
import sys
from functools import partial
from io import BytesIO

import pytest
import torch
from PIL import Image

from modules import chat, extensions, shared
from modules.text_generation import decode, generate_reply
from tests.conftest import ROOT
from tests.multimodal_fake_pipeline import encoded, noise_image, tag, tag_payloads

PIPELINE_DIRS = str(ROOT / "tests" / "multimodal_pipelines")


def load_multimodal(host, model_dir, pipeline: str | None = "fake-linear", argv: list[str] | None = None, **params):
    settings = {"multimodal-pipeline_dirs": [PIPELINE_DIRS], **{f"multimodal-{k}": v for k, v in params.items()}}
    host.load(model_dir, ["multimodal"], argv=(argv or []) + (["--multimodal-pipeline", pipeline] if pipeline else []),
              settings=settings)
    return sys.modules.get("extensions.multimodal.script")


def direct_reply(script, prompt: str, state: dict) -> tuple[str, int]:
    """Generate with model.generate from the stitched embeddings; (reply text, prompt length)."""
    _, ids, embeds = script.tokenizer_modifier(dict(state), prompt, None, None)
    output = shared.model.generate(inputs_embeds=embeds, attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                   max_new_tokens=state["max_new_tokens"], do_sample=False,
                                   suppress_tokens=[shared.tokenizer.eos_token_id],
                                   pad_token_id=shared.tokenizer.pad_token_id)
    return decode(output[0]).lstrip(" "), ids.shape[1]


def test_chat_turns_with_images_stream_and_equal_model_generate(host, llama_dir, tmp_path):
    script = load_multimodal(host, llama_dir, argv=["--nowebui", "--api"])
    history = chat.new_history()
    for turn, seed in enumerate((3, 4)):
        path = tmp_path / f"picture{turn}.png"
        noise_image(seed, (48, 40)).save(path)
        state = host.greedy_state(max_new_tokens=10, ban_eos_token=True, history=history,
                                  message_images=[str(path)], max_updates_second=0)
        outputs = [copy_of(o) for o in chat.chatbot_wrapper("What is in the picture?", state)]
        user_text = outputs[-1]["internal"][-1][0]
        assert script.IMAGE_TAG_RE.fullmatch(user_text.split("\n")[0]) and user_text.endswith("\nWhat is in the picture?")
        assert script.IMAGE_TAG_RE.search(outputs[-1]["visible"][-1][0])
        replies = [o["internal"][-1][1] for o in outputs[1:]]
        assert len(replies) > 2 and all(b.startswith(a) for a, b in zip(replies, replies[1:])), "the reply streams"
        prompt = chat.generate_chat_prompt(user_text, state, history=history)
        expected, prompt_tokens = direct_reply(script, prompt, state)
        assert replies[-1] == expected
        assert state["generation_stats"]["prompt_tokens"] == prompt_tokens
        assert script.IMAGE_TAG_RE.search(prompt)
        history = outputs[-1]
    # each new image embedded once: the oracle's second look hits the cache, the older image is a placeholder
    assert script.served_model.current_embedder().pipeline.batches == [1, 1]
    assert "extensions.multimodal.core.ui" not in sys.modules, "setup() loaded the pipeline without building a UI"


def copy_of(history: dict) -> dict:
    return {key: [list(turn) for turn in turns] for key, turns in history.items()}


def test_second_turn_sends_the_old_image_as_placeholders(host, llama_dir):
    script = load_multimodal(host, llama_dir)
    state = host.greedy_state()
    prompt = f"USER: {tag(noise_image(1))}\nOne?\nASSISTANT: A.\nUSER: {tag(noise_image(2))}\nTwo?\nASSISTANT:"
    _, ids, embeds = script.tokenizer_modifier(state, prompt, None, None)
    pipeline = script.served_model.current_embedder().pipeline
    placeholder_id = pipeline.placeholder_token_id()
    first = (ids[0] == placeholder_id).nonzero()[0, 0]
    assert torch.equal(embeds[0, first:first + 4], pipeline.placeholder_embeddings())
    assert ids.dtype == torch.int64 and ids.device == shared.model.device
    assert embeds.dtype == shared.model.dtype and embeds.shape[:2] == ids.shape


def test_prompts_without_images_come_back_unchanged(host, llama_dir):
    script = load_multimodal(host, llama_dir)
    ids = torch.tensor([[1, 2, 3]])
    result = script.tokenizer_modifier(host.greedy_state(), "no image here", ids, None)
    assert result[0] == "no image here" and result[1] is ids and result[2] is None
    assert script.custom_tokenized_length("no image here") == len(shared.tokenizer.encode("no image here"))


def test_truncation_notice_reaches_the_state(host, llama_dir):
    load_multimodal(host, llama_dir, add_all_images_to_prompt=True)
    prompt = "a" + tag(noise_image(1)) + "b " * 5 + tag(noise_image(2)) + " end"
    state = host.greedy_state(max_new_tokens=4, truncation_length=4 + 12)
    replies = list(generate_reply(prompt, state))
    assert replies and state["notices"] and "Removed 1 image(s)" in state["notices"][0]


def test_auto_pick_from_the_model_name(host, llama_dir, tmp_path):
    link = tmp_path / "tiny-fake-mm-llama"
    link.symlink_to(llama_dir, target_is_directory=True)
    script = load_multimodal(host, link, pipeline=None)
    assert "multimodal" in extensions.state
    assert script.served_model.current_embedder().pipeline.name() == "fake-linear"


def test_no_pipeline_for_the_model_is_a_clear_error_not_attribute_error(host, llama_dir, caplog):
    with caplog.at_level(logging.ERROR):
        script = load_multimodal(host, llama_dir, pipeline=None)
    assert "multimodal" not in extensions.state
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "--multimodal-pipeline" in logged and "fake-linear" in logged and "tiny-llama" in logged
    assert "AttributeError" not in logged
    # Measuring a prompt tries again (the model may have changed since) and says why it cannot.
    with pytest.raises(RuntimeError, match="No multimodal pipeline recognises the model 'tiny-llama'"):
        script.custom_tokenized_length("x")


def test_settings_override_params(host, llama_dir):
    script = load_multimodal(host, llama_dir, add_all_images_to_prompt=True, embedding_cache_mb=0)
    assert script.params["add_all_images_to_prompt"] is True and script.params["embedding_cache_mb"] == 0
    script.tokenizer_modifier(host.greedy_state(), f"{tag(noise_image(1))}{tag(noise_image(2))}", None, None)
    assert script.served_model.current_embedder().pipeline.batches == [2]


def test_pictures_are_kept_exactly_unless_the_jpeg_history_format_caps_them(host, llama_dir):
    sent = encoded(noise_image(1, (200, 100)), "PNG")
    script = load_multimodal(host, llama_dir)
    assert base64.b64decode(script.IMAGE_TAG_RE.fullmatch(script.image_to_history_tag(sent)).group("data")) == sent
    script.params["history_image_format"] = "jpeg"
    state = {}
    text = script.history_images.history_tags([sent], state, script.params)[0]
    image = Image.open(BytesIO(base64.b64decode(script.IMAGE_TAG_RE.fullmatch(text).group("data"))))
    assert image.format == "JPEG" and image.size == (64, 32)  # the fake pipeline's preferred size
    assert "1 picture(s) stored as JPEG" in state["notices"][0]


def test_image_placeholders_in_the_text_take_the_images_in_order(host, llama_dir, tmp_path):
    script = load_multimodal(host, llama_dir)
    paths = []
    for seed in (1, 2):
        paths.append(tmp_path / f"{seed}.png")
        noise_image(seed).save(paths[-1])
    text, visible = script.chat_input_modifier("compare <image> with <image>", "compare &lt;image&gt; with &lt;image&gt;",
                                               {"message_images": [str(p) for p in paths]})
    tags = tag_payloads(text)
    assert len(tags) == 2 and text.startswith("compare <img") and "> with <img" in text
    assert tag_payloads(visible) == tags


def test_input_hijack_fallback(host, llama_dir):
    script = load_multimodal(host, llama_dir)
    script.input_hijack.update(state=True, value=partial(script.add_chat_picture, noise_image(1)))
    text, visible = script.chat_input_modifier("hi", "hi", {})
    assert script.IMAGE_TAG_RE.match(text) and text.endswith("\nhi") and script.IMAGE_TAG_RE.search(visible)
    assert script.chat_input_modifier("hi", "hi", {}) == ("hi", "hi")


def test_the_jpeg_history_notice_reaches_the_reply(host, llama_dir):
    """chat_input_modifier says it (state['notices']) before the generation starts; the turn shows it."""
    script = load_multimodal(host, llama_dir)
    script.params["history_image_format"] = "jpeg"
    state = host.greedy_state(max_new_tokens=4, history=chat.new_history(),
                              message_images=[encoded(noise_image(3, (200, 100)), "PNG")])
    latest = list(chat.generate_chat_reply("What is it?", state, loading_message=False))[-1]
    assert "1 picture(s) stored as JPEG" in latest["visible"][-1][1]
    assert any("stored as JPEG" in notice for notice in state["notices"])
