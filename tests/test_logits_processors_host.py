"""Batch-level logits processors through the host's real generation, on the tiny Llama.

The oracle for "not enabled" is the same host with no processors loaded: a loaded processor that
no request switches on must leave the greedy reply exactly as it was.
"""
from __future__ import annotations

import sys
from typing import Optional

import pytest

from examples.target_token import TargetTokenLogitsProcessor
from modules import shared
from modules.logits_bridge import LogitsProcessorError
from modules.logits_processors import BatchUpdate, LogitsProcessor
from modules.text_generation import encode, generate_reply
from tests.exploding_processor import Exploding

PROMPT = "The quick brown fox"
N = 6


def reply(**state_overrides) -> str:
    from fixtures.host_helpers import greedy_state

    state = greedy_state(max_new_tokens=N, ban_eos_token=True, **state_overrides)
    text = list(generate_reply(PROMPT, state))[-1]
    assert state["generation_stats"]["completion_tokens"] == N
    return text


def token_id(text: str) -> int:
    ids = encode(text, add_special_tokens=False)[0].tolist()
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


class LocalTarget(TargetTokenLogitsProcessor):
    """Defined here and passed as a class object (the library way); its own argument name."""
    arg_name = "local_target_token"


@pytest.fixture
def baseline(host, llama_dir) -> str:
    host.load(llama_dir)
    assert shared.logits_processors is None or all(
        type(p).__module__ == "textgen_test_plugin" for p in shared.logits_processors.processors)
    return reply()


@pytest.mark.parametrize("how", ["class path", "entry point", "class object"])
def test_target_token_is_forced_only_for_the_request_that_asks(host, llama_dir, baseline, how):
    argv, classes, arg = [], [], {"class path": "target_token", "entry point": "plugin_target_token",
                                  "class object": "local_target_token"}[how]
    if how == "class path":
        argv = ["--logits-processors", "examples.target_token:TargetTokenLogitsProcessor"]
    elif how == "class object":
        classes = [LocalTarget]
    host.load(llama_dir, argv=argv, logits_processors=classes)
    red = token_id(" red")
    forced = reply(logits_processor_args={arg: red})
    assert forced == " red" * N
    assert baseline != forced
    assert reply() == baseline, "a request that did not ask is left alone (the add replaced the forced one)"
    assert reply(logits_processor_args={"some_other_arg": red}) == baseline
    assert reply(logits_processor_args={arg: red}) == forced


def test_sampling_request_is_forced_too(host, llama_dir):
    host.load(llama_dir, argv=["--logits-processors", "examples.target_token:TargetTokenLogitsProcessor"])
    blue = token_id(" blue")
    assert reply(do_sample=True, temperature=1.0, top_p=0.9, seed=3, logits_processor_args={"target_token": blue}) \
        == " blue" * N


class Counting(LogitsProcessor):
    """Counts its calls; adds a constant to every logit (which never changes the argmax)."""
    invariant = True

    def __init__(self, config, device, is_pin_memory):
        self.applies = 0
        self.updates: list[Optional[BatchUpdate]] = []

    def is_argmax_invariant(self) -> bool:
        return self.invariant

    def update_state(self, batch_update):
        self.updates.append(batch_update)

    def apply(self, logits):
        self.applies += 1
        return logits.add_(1.0)


class CountingVariant(Counting):
    invariant = False


def test_argmax_invariant_processors_are_skipped_only_under_greedy(host, llama_dir, baseline):
    host.load(llama_dir, logits_processors=[Counting, CountingVariant])
    invariant, variant = shared.logits_processors.processors[:2]
    assert reply() == baseline
    assert (invariant.applies, variant.applies) == (0, N), "greedy: only the processor that may change argmax runs"
    assert len(invariant.updates) == N, "update_state runs at every step all the same"
    assert invariant.updates[0].added[0].params.greedy and invariant.updates[1:] == [None] * (N - 1)
    reply(do_sample=True, temperature=0.8, seed=1)
    assert (invariant.applies, variant.applies) == (N, 2 * N)
    assert not invariant.updates[N].added[0].params.greedy


class Recorder(LogitsProcessor):
    """Keeps what the batch update told it about the one request, and the output ids at each step."""

    def __init__(self, config, device, is_pin_memory):
        self.config = config
        self.added = None
        self.outputs_seen: list[list[int]] = []

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is not None and batch_update.added:
            self.added = batch_update.added[0]

    def apply(self, logits):
        self.outputs_seen.append(list(self.added.output_tok_ids))
        return logits


def test_processors_see_the_prompt_the_arguments_and_the_growing_output(host, llama_dir):
    host.load(llama_dir, logits_processors=[Recorder])
    recorder = shared.logits_processors.processors[0]
    assert recorder.config.tokenizer is shared.tokenizer and recorder.config.model_config is shared.model.config
    state_args = {"a": [1, 2], "b": {"c": "d"}}
    from fixtures.host_helpers import greedy_state

    state = greedy_state(max_new_tokens=N, ban_eos_token=True, logits_processor_args=state_args)
    list(generate_reply(PROMPT, state))
    index, params, prompt_ids, output_ids = recorder.added
    assert index == 0 and params.extra_args == state_args and params.max_new_tokens == N
    assert params.extra_args is not state_args, "a processor gets its own copy"
    assert prompt_ids == encode(PROMPT)[0].tolist()
    # Step i sees the i tokens before it; the last token ends generation, so no step sees it (the list
    # then holds it too: the streamer hands every token over, as vLLM's list holds the whole reply).
    assert len(output_ids) == N and recorder.outputs_seen == [output_ids[:i] for i in range(N)]
    assert list(generate_reply(PROMPT, dict(state)))[-1].startswith(shared.tokenizer.decode(output_ids))


def test_an_exception_in_a_processor_fails_that_request_and_the_next_one_works(host, llama_dir, baseline):
    host.load(llama_dir, logits_processors=[Exploding])
    with pytest.raises(LogitsProcessorError, match=r"Exploding failed in apply\(\): RuntimeError: the fuse was lit"):
        reply(logits_processor_args={"explode": True})
    assert not shared.generation_lock.locked()
    assert reply() == baseline


def test_logits_processor_args_of_the_wrong_type_are_refused(host, llama_dir):
    host.load(llama_dir)
    with pytest.raises(ValueError, match="logits_processor_args must be a mapping"):
        reply(logits_processor_args=[1, 2])


def test_validate_params_refuses_a_bad_argument_before_generating(host, llama_dir):
    host.load(llama_dir, argv=["--logits-processors", "examples.target_token:TargetTokenLogitsProcessor"])
    with pytest.raises(ValueError, match="target_token must be a token id"):
        reply(logits_processor_args={"target_token": "red"})


def test_extension_logits_processor_modifier_runs_beside_batch_processors(host, llama_dir, tmp_path, monkeypatch):
    """An extension's Hugging Face processor (added through the hook) and a batch-level one both act."""
    folder = tmp_path / "ban_red"
    folder.mkdir()
    (folder / "script.py").write_text(
        "from transformers import LogitsProcessor\n"
        "class BanRed(LogitsProcessor):\n"
        "    def __init__(self, token): self.token = token\n"
        "    def __call__(self, input_ids, scores):\n"
        "        scores[:, self.token] = float('-inf')\n"
        "        return scores\n"
        "seen = []\n"
        "def logits_processor_modifier(processor_list, input_ids):\n"
        "    from modules import shared\n"
        "    seen.append([type(p).__name__ for p in processor_list])\n"
        "    processor_list.append(BanRed(shared.tokenizer.convert_tokens_to_ids('\\u0120red')))\n"
        "    return processor_list\n")
    import extensions

    monkeypatch.setattr(extensions, "__path__", [*extensions.__path__, str(tmp_path)])
    host.load(llama_dir, ["ban_red"], argv=["--logits-processors", "examples.target_token:TargetTokenLogitsProcessor"])
    blue = token_id(" blue")
    assert " red" not in reply()
    assert reply(logits_processor_args={"target_token": blue}) == " blue" * N
    assert sys.modules["extensions.ban_red.script"].seen[0] == ["BatchBridge"], "the hook sees the batch bridge first"
