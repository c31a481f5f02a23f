"""A chat's pictures set aside while its prompt renders (modules/picture_stand_ins.py): the same prompt.

Each family's tiny checkpoint keeps its chat template as on the hub (string templates, and templates
that take content only as typed parts), plus the tiny Llama's string template. The oracle is the
rendering that carries the pictures' tags through the template (`chat.render` on the real messages).
"""
from __future__ import annotations

import pytest

from fixtures import host_helpers, vlm_families
from fixtures.vlm_families import png
from modules import chat, picture_stand_ins, shared
from modules.message_memo import MessageMemo
from modules.extensions import apply_extensions
from modules.text_generation import text_for_plain_ids

FAMILIES = list(vlm_families.FAMILIES)


def chat_with_pictures() -> dict:
    """Two turns through the host: one picture, then two of other sizes in one message."""
    history = chat.new_history()
    for text, pictures in [("What is this?", [png(40, 30, 1)]), ("And these two?", [png(24, 56, 2), png(64, 48, 3)])]:
        state = host_helpers.greedy_state(history=history, max_new_tokens=3, message_images=pictures)
        history = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
    return history


def template_inputs(monkeypatch) -> list[str]:
    """The messages each call of the chat template gets from now on, as text."""
    seen: list[str] = []
    apply = shared.tokenizer.apply_chat_template

    def recording(messages, *args, **kwargs):
        seen.append(repr(messages))
        return apply(messages, *args, **kwargs)

    monkeypatch.setattr(shared.tokenizer, "apply_chat_template", recording)
    return seen


@pytest.mark.parametrize("name", FAMILIES + ["tiny-llava"])
def test_the_prompt_is_the_one_rendered_with_the_pictures_in_it(host, family_folder, llava_dir, name, monkeypatch):
    host.load(llava_dir if name == "tiny-llava" else family_folder(name), ["multimodal"])
    history = chat_with_pictures()
    state = host_helpers.greedy_state(history=history)
    pattern = apply_extensions("image_tag_pattern")
    messages = chat.build_messages(history["internal"], "And then?", state)
    seen = template_inputs(monkeypatch)
    prompt = chat.generate_chat_prompt("And then?", state)
    continued = chat.generate_chat_prompt("", state, _continue=True)
    data = [tag.group("data") for tag in pattern.finditer(prompt)]
    assert len(data) == 3 and seen
    assert not any(d in text for d in data for text in seen), "the template rendered a picture's data"
    assert prompt == chat.render(messages, add_generation_prompt=True)
    assert continued == chat.render(messages[:-1], continue_last=True)
    assert text_for_plain_ids(prompt) == pattern.sub("", prompt)
    assert picture_stand_ins.plain_text(prompt) is not None, "the plain text came from the render"


def test_a_picture_is_searched_for_once_across_turns(host, llava_dir, monkeypatch):
    host.load(llava_dir, ["multimodal"])
    history = chat_with_pictures()
    state = host_helpers.greedy_state(history=history)
    chat.generate_chat_prompt("And then?", state)
    searched: list[str] = []
    stand_ins = picture_stand_ins.stand_ins
    monkeypatch.setattr(picture_stand_ins, "stand_ins", lambda content, pattern: searched.append(content) or
                        stand_ins(content, pattern))
    chat.generate_chat_prompt("And then, at last?", state)
    assert searched == ["And then, at last?"], "only the new message is searched"


def test_the_kept_messages_stay_within_their_bound():
    """`MessageMemo` (the set-aside messages' and the chat's HTML): the least recently used text goes first."""
    memo = MessageMemo(max_chars=10)
    memo.put(("abcd", "p"), 1)
    memo.put(("efgh", "p"), 2)
    assert memo.get(("abcd", "p")) == 1  # now the most recently used
    memo.put(("ijkl", "p"), 3)
    assert memo.get(("efgh", "p")) is None and memo.get(("abcd", "p")) == 1 and memo.get(("ijkl", "p")) == 3
    assert memo.chars == 8
    memo.put(("a text longer than the bound", "p"), 4)
    assert memo.chars <= 10 and memo.get(("abcd", "p")) is None
