"""Mllama's prefix cache through `/v1/chat/completions` on one server: its cross-attention layers hold the
pictures' states, not the prompt's tokens, so they are never cropped as tokens, and kept only while
the prompt's pictures are the same.

The sequence: a chat with a picture; a new chat without one that shares the template's first tokens
(the cache must not let it read the old picture); a new chat with another picture; that chat's second
turn (the picture's states are reused); a third turn adding a picture (the states are refilled). Each
reply equals Hugging Face's (`tests/test_vlm_families_host.hf_reply`); turns with pictures also show
that another picture changes the reference.
"""
from __future__ import annotations

from fixtures import api_helpers, vlm_families
from tests.test_prefix_cache_sliding import ask, user
from tests.test_vlm_families_host import api_turn, check, hf_reply, png


def test_chats_sharing_prefixes_with_and_without_pictures(tmp_path):
    folder = vlm_families.build_mllama(tmp_path / "mllama")
    first, second, third = png(64, 48, 31), png(40, 72, 32), png(48, 48, 33)
    with api_helpers.serving(folder, ["multimodal"]) as api:
        check([("What is this?", [first], None)], ask(api, [user("What is this?", [first])]))
        assert ask(api, [user("What is this?", [])]) == hf_reply([("What is this?", [], None)])
        messages, turns = [], []
        for text, pictures in [("Describe it.", [second]), ("And the colours?", []), ("And this one?", [third])]:
            api_turn(api, messages, turns, text, pictures)
