"""Prefix KV reuse gives exactly the tokens a fresh run gives, and really reuses the prefix."""
from __future__ import annotations

import torch

from modules import chat, prefix_cache, shared


def turn(host, history: dict, text: str, reuse: bool, regenerate: bool = False) -> dict:
    state = host.greedy_state(max_new_tokens=8, ban_eos_token=True, history=history, prefix_cache=reuse)
    return list(chat.generate_chat_reply(text, state, regenerate=regenerate))[-1]


def conversation(host, steps, reuse: bool) -> list[dict]:
    """Runs (action, text) steps; returns the history after each step."""
    history = chat.new_history()
    results = []
    for action, text in steps:
        if action == "say":
            history = turn(host, history, text, reuse)
        elif action == "regenerate":
            history = turn(host, history, "", reuse, regenerate=True)
        elif action == "remove_last":
            _, history = chat.remove_last_message(history)
        elif action == "edit_first":
            history = {k: [list(t) for t in v] for k, v in history.items()}
            history["internal"][0][0] = history["visible"][0][0] = text
        results.append(history)
    return results


STEPS = [("say", "Hello world"), ("say", "Describe the image."), ("regenerate", ""), ("say", "What is red?"),
         ("remove_last", ""), ("say", "A blue square?"), ("edit_first", "Goodbye world"), ("say", "And now?")]


def test_reuse_gives_the_same_tokens_as_fresh_runs(llama):
    with llama.reused_tokens() as reused:
        with_reuse = conversation(llama, STEPS, reuse=True)
    without = conversation(llama, STEPS, reuse=False)
    assert with_reuse == without
    assert sum(reused) > 50, "later turns reused the earlier turns' KV cache"


def test_reuse_is_off_with_the_flag(llama):
    shared.args.no_prefix_cache = True
    with llama.reused_tokens() as reused:
        conversation(llama, STEPS[:3], reuse=True)
    assert sum(reused) == 0


def test_common_prefix_compares_rows():
    a = torch.arange(12.0).reshape(4, 3)
    b = a.clone()
    b[2, 1] = -1
    assert prefix_cache.common_prefix_length(a, b) == 2
    assert prefix_cache.common_prefix_length(a, a[:3]) == 3
    assert prefix_cache.common_prefix_length(a[:0], a) == 0


def test_identical_prompt_still_prefills_its_last_token(llama):
    state = llama.greedy_state(max_new_tokens=5, ban_eos_token=True)
    from modules.text_generation import generate_reply

    first = list(generate_reply("Hello world", dict(state)))[-1]
    second = list(generate_reply("Hello world", dict(state)))[-1]
    assert first == second
