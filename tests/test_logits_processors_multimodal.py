"""The multimodal extension keeps image placeholder tokens out of replies (tiny LLaVA, llava-hf pipeline).

`BoostToken` makes the placeholder's logit the largest by far; without the extension the reply is
nothing but placeholders (the oracle that the boost works), with it none appears.
"""
from __future__ import annotations

import sys

import pytest

from modules import shared
from modules.logits_processors import LogitsProcessor, apply_moves
from modules.text_generation import generate_reply
from fixtures import api_helpers
from fixtures.host_helpers import greedy_state

N = 6
PLACEHOLDER = "<image>"


class BoostToken(LogitsProcessor):
    """Adds 1000 to the logit of the token id a request names in `boost_token` (additive: order-proof)."""

    def __init__(self, config, device, is_pin_memory):
        self.req_info: dict[int, int] = {}

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, _, _ in batch_update.added:
            self.req_info.pop(index, None)
            if (params.extra_args or {}).get("boost_token") is not None:
                self.req_info[index] = params.extra_args["boost_token"]
        apply_moves(self.req_info, batch_update.moved)

    def apply(self, logits):
        for index, token in self.req_info.items():
            logits[index, token] += 1000.0
        return logits


def reply(prompt: str, **overrides) -> str:
    placeholder = shared.tokenizer.convert_tokens_to_ids(PLACEHOLDER)
    state = greedy_state(max_new_tokens=N, ban_eos_token=True, skip_special_tokens=False,
                         logits_processor_args={"boost_token": placeholder}, **overrides)
    text = list(generate_reply(prompt, state))[-1]
    assert state["generation_stats"]["completion_tokens"] == N
    return text


def image_prompt() -> str:
    script = sys.modules["extensions.multimodal.script"]
    return script.image_to_history_tag(api_helpers.image_bytes("red", "circle")) + "\nUSER: What is it?\nASSISTANT:"


def test_without_the_extension_the_boost_makes_the_placeholder_win(host, llava_dir):
    host.load(llava_dir, logits_processors=[BoostToken])
    assert reply("USER: Hello\nASSISTANT:") == PLACEHOLDER * N


@pytest.mark.parametrize("sampling", [False, True])
def test_with_the_extension_the_placeholder_never_appears(host, llava_dir, sampling):
    host.load(llava_dir, ["multimodal"], logits_processors=[BoostToken])
    script = sys.modules["extensions.multimodal.script"]
    assert any(isinstance(p, script.PlaceholderBan) for p in shared.logits_processors.processors)
    overrides = dict(do_sample=True, temperature=1.0, top_p=1.0, seed=5) if sampling else {}
    for prompt in ["USER: Hello\nASSISTANT:", image_prompt()]:
        text = reply(prompt, **overrides)
        assert PLACEHOLDER not in text and text.strip(), text
    assert script.logits_processor_modifier([], None) == [], "the hook adds nothing where the batch ban runs"


def test_in_a_host_without_batch_processors_the_hook_bans_instead(host, llava_dir, monkeypatch):
    """text-generation-webui has no modules.logits_processors: the extension falls back to its hook."""
    monkeypatch.setitem(sys.modules, "modules.logits_processors", None)  # its import now fails
    host.load(llava_dir, ["multimodal"], logits_processors=[BoostToken])
    script = sys.modules["extensions.multimodal.script"]
    assert script.PlaceholderBan is None and script.logits_processors == []
    assert "PlaceholderBan" not in {type(p).__name__ for p in shared.logits_processors.processors}
    assert [type(p).__name__ for p in script.logits_processor_modifier([], None)] == ["HFPlaceholderBan"]
    text = reply("USER: Hello\nASSISTANT:")
    assert PLACEHOLDER not in text and text.strip(), text
