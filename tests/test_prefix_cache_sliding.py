"""The prefix cache on models with sliding-window layers (Gemma 3, Aya Vision's Cohere2), window full.

Such a layer keeps only its window once the window is full, so its cache can continue where the last
prompt ended but cannot be cropped back to an earlier token. A new chat that shares only a short
prefix with the last one (the template's first tokens) used to crop it anyway, and the next forward
failed ("The size of tensor a (24) must match the size of tensor b (31)"): HTTP 500 on a valid
request, prefix cache on (the default). Here, through `/v1/chat/completions` on one server, with
windows of 8 tokens (every prompt is longer): two pictures of different sizes, then a new chat with
another picture, then that chat's second turn (which continues the cache), each equal to Hugging
Face's reply (`tests/test_vlm_families_host.hf_reply`), which the pictures are shown to change.
"""
from __future__ import annotations

import functools

import pytest

from fixtures import api_helpers, vlm_families
from tests.test_vlm_families_host import NEW_TOKENS, check, hf_reply, png

# One sliding and one full layer each, so the pictures stay in view of the last tokens.
BUILDERS = {"gemma3": functools.partial(vlm_families.build_gemma3, layer_types=["sliding_attention", "full_attention"]),
            "aya_vision": functools.partial(vlm_families.build_aya_vision, seed=1)}


def ask(api, messages: list, **extra_body) -> str:
    """The greedy reply; `extra_body`: text-generation-webui's parameters (`repetition_penalty`, ...)."""
    return api.client().chat.completions.create(model="any", messages=messages, max_tokens=NEW_TOKENS, temperature=0,
                                                extra_body=extra_body or None).choices[0].message.content


def user(text: str, pictures: list[bytes]) -> dict:
    content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(p)}} for p in pictures]
    return {"role": "user", "content": content + [{"type": "text", "text": text}]}


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_a_new_chat_after_a_longer_one_with_sliding_window_layers(tmp_path, family):
    folder = BUILDERS[family](tmp_path / family, sliding_window=8)
    first, second, other = png(64, 48, 21), png(40, 72, 22), png(48, 48, 23)
    with api_helpers.serving(folder, ["multimodal"]) as api:
        check([("Compare these two.", [first, second], None)], ask(api, [user("Compare these two.", [first, second])]))
        turns = [("What is this?", [other], None)]
        reply = ask(api, [user("What is this?", [other])])
        check(turns, reply)
        turns[-1] = ("What is this?", [other], reply)
        follow = [user("What is this?", [other]), {"role": "assistant", "content": reply}, user("And the colours?", [])]
        turns.append(("And the colours?", [], None))
        assert ask(api, follow) == hf_reply(turns)
