"""Prefix reuse and the embedding cache with images: never confuse two images, same tokens as fresh runs."""
from __future__ import annotations

import io
import sys

import pytest
from PIL import Image

from modules import chat, prefix_cache, shared


def png(colour, size=(40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def llava(host, llava_dir):
    host.load(llava_dir, ["multimodal"], settings={"multimodal-add_all_images_to_prompt": True})
    return host


def script():
    return sys.modules["extensions.multimodal.script"]


def ask(host, history, text, reuse, **kw):
    state = host.greedy_state(max_new_tokens=6, ban_eos_token=True, history=history, prefix_cache=reuse)
    return list(chat.generate_chat_reply(text, state, **kw))[-1]


def run(host, reuse: bool, first_colour: str, second_colour: str, edit_first_to: str | None = None) -> list[dict]:
    tag1 = script().image_to_history_tag(png(first_colour))
    tag2 = script().image_to_history_tag(png(second_colour))
    out = []
    history = ask(host, chat.new_history(), f"{tag1}What is this?", reuse)
    out.append(history)
    history = ask(host, history, "Tell me more.", reuse)
    out.append(history)
    history = ask(host, history, f"{tag2}And this one?", reuse)
    out.append(history)
    history = ask(host, history, "", reuse, regenerate=True)
    out.append(history)
    _, history = chat.remove_last_message(history)
    history = ask(host, history, "Compare them.", reuse)
    out.append(history)
    if edit_first_to is not None:
        edited = {k: [list(t) for t in v] for k, v in history.items()}
        new_tag = script().image_to_history_tag(png(edit_first_to))
        edited["internal"][0][0] = edited["visible"][0][0] = f"{new_tag}What is this?"
        out.append(ask(host, edited, "Again?", reuse))
    return out


def test_reuse_equals_fresh_runs_with_images(llava):
    with llava.reused_tokens() as counts:
        reused = run(llava, True, (200, 30, 30), (30, 30, 200), edit_first_to=(30, 200, 30))
    assert sum(counts) > 0
    fresh = run(llava, False, (200, 30, 30), (30, 30, 200), edit_first_to=(30, 200, 30))
    assert [h["internal"] for h in reused] == [h["internal"] for h in fresh]


def test_a_changed_image_of_the_same_size_is_never_reused(llava):
    """Same placeholder ids, same size, different pixels: the prefix must stop at the image."""
    tag_a = script().image_to_history_tag(png((250, 0, 0)))
    tag_b = script().image_to_history_tag(png((0, 0, 250)))
    ask(llava, chat.new_history(), f"Look: {tag_a} what colour?", True)
    with llava.reused_tokens() as counts:
        with_reuse = ask(llava, chat.new_history(), f"Look: {tag_b} what colour?", True)
    [reused] = counts
    prefix_cache.clear()
    fresh = ask(llava, chat.new_history(), f"Look: {tag_b} what colour?", False)
    assert with_reuse["internal"] == fresh["internal"]
    text_before_image = len(shared.tokenizer.encode("USER: Look: "))
    assert 0 < reused <= text_before_image
