"""encode/decode semantics and generate_reply against model.generate called directly."""
from __future__ import annotations

import logging
import time

import torch

from modules import shared, text_generation
from modules.text_generation import decode, encode, generate_reply, get_max_prompt_length


def test_encode_adds_one_bos_and_removes_duplicates(llama):
    bos = shared.tokenizer.bos_token_id
    ids = encode("Hello world")
    assert ids.shape[0] == 1 and ids[0, 0] == bos and ids[0, 1] != bos
    doubled = encode("<s>Hello world")
    assert doubled[0, 0] == bos and doubled[0, 1] != bos
    assert torch.equal(doubled, ids)


def test_encode_without_bos_adds_none_and_keeps_the_prompts_own(llama):
    """text-generation-webui's rule: add_bos_token=False forces none, keeps a written one, never two."""
    bos = shared.tokenizer.bos_token_id
    written = encode("<s>Hello world", add_bos_token=False)[0]
    assert written[0] == bos and written[1] != bos
    assert encode("Hello world", add_special_tokens=False)[0, 0] != bos


def test_truncation_keeps_the_last_tokens(llama):
    full = encode("The quick brown fox jumps over the lazy dog")
    cut = encode("The quick brown fox jumps over the lazy dog", truncation_length=4)
    assert cut.shape[1] == 4 and torch.equal(cut[0], full[0, -4:])


def test_decode_round_trip(llama):
    assert decode(encode("Hello world")[0]) == "Hello world"
    assert decode(encode("Hello world")[0], skip_special_tokens=False).startswith("<s>")


def test_a_fast_reply_updates_at_most_max_updates_second(llama):
    """The tiny model makes its 48 tokens far faster than 5 a second: they come in a few updates (the
    first at once, at most 5 a second while it runs, the rest when it ends, and the finished text),
    and the reply is the one streamed token by token."""
    prompt = "USER: Describe the image.\nASSISTANT:"
    each = list(generate_reply(prompt, llama.greedy_state(max_new_tokens=48, ban_eos_token=True, max_updates_second=0)))
    started = time.perf_counter()
    few = list(generate_reply(prompt, llama.greedy_state(max_new_tokens=48, ban_eos_token=True, max_updates_second=5)))
    elapsed = time.perf_counter() - started
    assert few[-1] == each[-1] and len(each) > 10
    assert len(few) <= elapsed * 5 + 3, (len(few), elapsed)


def test_the_reply_ends_when_the_generation_does_not_an_update_later(llama):
    """One update every 20 s: the first token goes out at once, and the rest as soon as the model is done."""
    prompt = "USER: Describe the image.\nASSISTANT:"
    state = llama.greedy_state(max_new_tokens=24, ban_eos_token=True, max_updates_second=0.05)
    started = time.perf_counter()
    updates = list(generate_reply(prompt, state))
    assert len(updates) <= 3 and time.perf_counter() - started < 10


def test_max_prompt_length():
    assert get_max_prompt_length({"truncation_length": 2048, "max_new_tokens": 512}) == 1536


def test_truncation_length_comes_from_the_model_config(llama):
    assert shared.settings["truncation_length"] == shared.model.config.max_position_embeddings


def test_greedy_reply_equals_model_generate(llama):
    state = llama.greedy_state(max_new_tokens=12, ban_eos_token=True, max_updates_second=0)
    prompt = "USER: Describe the image.\nASSISTANT:"
    replies = list(generate_reply(prompt, state))
    ids = encode(prompt)
    direct = shared.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                   suppress_tokens=[shared.tokenizer.eos_token_id], pad_token_id=shared.tokenizer.pad_token_id)
    assert replies[-1] == decode(direct[0, ids.shape[1]:])
    assert len(replies) > 2, "the reply streams token by token"
    assert all(later.startswith(earlier) for earlier, later in zip(replies, replies[1:]))
    assert state["generation_stats"]["completion_tokens"] == 12
    assert state["generation_stats"]["prompt_tokens"] == ids.shape[1]


def test_stopping_string_cuts_the_reply(llama):
    state = llama.greedy_state(max_new_tokens=20, ban_eos_token=True)
    full = list(generate_reply("Hello world", state))[-1]
    assert len(full) > 4
    stop = full[2:4]
    first = full.find(stop)
    cut = list(generate_reply("Hello world", dict(state, custom_stopping_strings=repr(stop))))
    assert cut[-1] == full[:first]
    assert all(stop not in r for r in cut)
    via_arg = list(generate_reply("Hello world", state, stopping_strings=[stop]))[-1]
    assert via_arg == full[:first]
    assert state["generation_stats"]["finish_reason"] == "stop"



def test_tokens_that_came_together_are_counted_up_to_the_stop(llama):
    """A fast reply's tokens come merged into one update (here one a second); with a stopping string the
    count ends at the token that completes it, as vLLM counts, not at the last one generated."""
    prompt = "Hello world"
    ids = encode(prompt)
    direct = shared.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                                   suppress_tokens=[shared.tokenizer.eos_token_id],
                                   pad_token_id=shared.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    full = decode(direct)
    stop = decode(direct[:10]).rstrip()[-2:]  # whichever token first completes it
    needed = next(n for n in range(1, 21) if stop in decode(direct[:n]))
    assert 2 < needed < 18, (stop, needed)
    state = llama.greedy_state(max_new_tokens=20, ban_eos_token=True, max_updates_second=1)
    replies = list(generate_reply(prompt, state, stopping_strings=[stop]))
    assert replies[-1] == full[:full.find(stop)] and len(replies) <= 3, "the tokens came merged"
    assert state["generation_stats"]["completion_tokens"] == needed


def test_stop_flag_interrupts(llama):
    state = llama.greedy_state(max_new_tokens=200, ban_eos_token=True, max_updates_second=0)
    seen = []
    for reply in generate_reply("Hello world", state):
        seen.append(reply)
        if len(seen) == 3:
            text_generation.stop_everything_event()
    assert len(seen) < 10
    assert state["generation_stats"]["completion_tokens"] < 10


def test_lock_is_released_when_the_consumer_walks_away(llama):
    state = llama.greedy_state(max_new_tokens=200, ban_eos_token=True)
    stream = generate_reply("Hello world", state)
    next(stream)
    assert shared.generation_lock.locked()
    stream.close()
    assert not shared.generation_lock.locked()
    assert list(generate_reply("Hello", llama.greedy_state(max_new_tokens=3)))


def test_seed_makes_sampling_repeatable(llama):
    state = llama.greedy_state(do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=10, seed=123,
                               ban_eos_token=True)
    first = list(generate_reply("Hello", dict(state)))[-1]
    second = list(generate_reply("Hello", dict(state)))[-1]
    assert first == second


class Recorded(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_requests_give_transformers_nothing_to_warn_about(host, sampler_defaults_llama_dir):
    """Greedy with the settings' temperature 0.7 and top_p 0.9, and sampling, on a checkpoint with its own
    sampler defaults: the host passes each sampler only where it runs, so transformers does not warn that
    flags are ignored (it would once per process, in every server's log)."""
    host.load(sampler_defaults_llama_dir)
    greedy = host.greedy_state(max_new_tokens=4)
    assert (greedy["temperature"], greedy["top_p"]) != (1.0, 1.0)
    recorded = Recorded()
    logging.getLogger("transformers").addHandler(recorded)
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process: an earlier test may have said it
    try:
        for state in (greedy, host.greedy_state(do_sample=True, max_new_tokens=4, seed=3)):
            assert list(generate_reply("Hello world", state))
    finally:
        logging.getLogger("transformers").removeHandler(recorded)
    assert [r.getMessage() for r in recorded.records] == []
