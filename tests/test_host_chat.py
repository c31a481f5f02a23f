"""Chat prompts, history trimming, regenerate/remove-last, and saving/loading histories."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal

import pytest

from modules import chat, shared
from modules.text_generation import get_encoded_length, get_max_prompt_length


def history_of(turns: int) -> dict:
    internal = [[f"Question number {i} about a red circle?", f"Answer number {i}."] for i in range(turns)]
    return {"internal": internal, "visible": [list(t) for t in internal]}


def test_prompt_uses_the_chat_template(llama):
    state = llama.greedy_state(history=history_of(1))
    prompt = chat.generate_chat_prompt("What now?", state)
    assert prompt == ("USER: Question number 0 about a red circle?\nASSISTANT: Answer number 0.</s>\n"
                      "USER: What now?\nASSISTANT:")


def test_a_bot_prefix_hook_that_changes_the_prefix_changes_the_prompt(llama, monkeypatch):
    """The `bot_prefix` hook's result takes the place of the template's generation prefix."""
    state = llama.greedy_state(history=history_of(1))
    hooks = chat.apply_extensions
    monkeypatch.setattr(chat, "apply_extensions",
                        lambda name, *args: args[0] + " Sure," if name == "bot_prefix" else hooks(name, *args))
    prompt = chat.generate_chat_prompt("What now?", state)
    assert prompt == ("USER: Question number 0 about a red circle?\nASSISTANT: Answer number 0.</s>\n"
                      "USER: What now?\nASSISTANT: Sure,")


def test_plain_fallback_without_a_template(llama):
    shared.tokenizer.chat_template = None
    try:
        state = llama.greedy_state(history=history_of(1))
        prompt = chat.generate_chat_prompt("What now?", state)
        assert prompt.endswith("User: What now?\nAssistant:")
        assert chat.get_stopping_strings(state) == ["\nUser:"]
    finally:
        shared.tokenizer.chat_template = chat_template_of_fixture()


def chat_template_of_fixture() -> str:
    from fixtures.tiny_models import CHAT_TEMPLATE

    return CHAT_TEMPLATE


def test_oldest_turns_are_dropped_until_the_prompt_fits(llama):
    state = llama.greedy_state(history=history_of(30), truncation_length=200, max_new_tokens=50)
    prompt = chat.generate_chat_prompt("Last question?", state)
    assert get_encoded_length(prompt) <= get_max_prompt_length(state)
    assert "Question number 29" in prompt and "Question number 0 " not in prompt
    one_more = chat.build_messages(state["history"]["internal"][-1 - prompt.count("ASSISTANT: Answer"):],
                                   "Last question?", state)
    assert get_encoded_length(chat.render_messages(one_more, state)) > get_max_prompt_length(state), "dropped no more than needed"



@pytest.mark.parametrize("max_new_tokens", [200, 4096])
def test_no_room_for_any_prompt_is_refused_and_the_chat_kept(llama, max_new_tokens):
    """max_new_tokens at or past truncation_length leaves no prompt at all: a clear refusal, not a reply
    to the message alone (every turn before it silently left out), and the history stays as it was."""
    history = history_of(3)
    state = llama.greedy_state(history=history, truncation_length=200, max_new_tokens=max_new_tokens)
    with pytest.raises(ValueError, match=r"No room for the prompt: truncation_length \(200\) - max_new_tokens"):
        chat.generate_chat_prompt("Last question?", state)
    with pytest.raises(ValueError, match="Lower max_new_tokens"):
        list(chat.generate_chat_reply("Last question?", state, loading_message=False))
    assert state["history"] == history_of(3)


@pytest.mark.parametrize("continue_last", [False, True])
def test_the_fewest_oldest_turns_are_dropped_with_a_few_renders(llama, monkeypatch, continue_last):
    """The prompt is the one dropping the oldest turns one at a time until it fits gives (nothing fits:
    all but the turn answered go), found with a few renders: a long chat past its context is not
    rendered once per turn dropped."""
    renders, render = [], chat.render_messages
    monkeypatch.setattr(chat, "render_messages", lambda *a, **k: renders.append(1) or render(*a, **k))
    history = history_of(120)
    kept = set()
    for truncation in (100, 230, 700, 1500, 8000):
        state = llama.greedy_state(history=history, truncation_length=truncation, max_new_tokens=50)
        expected = one_at_a_time(history["internal"], state, continue_last)
        renders.clear()
        assert chat.generate_chat_prompt("Last question?", state, _continue=continue_last) == expected
        assert len(renders) <= 9, "log2(120) renders, the whole chat's and the last one's"
        kept.add(expected.count("Question number"))
    assert min(kept) == (1 if continue_last else 0) and max(kept) == 120 and len(kept) == 5


def one_at_a_time(internal: list, state: dict, continue_last: bool) -> str:
    for dropped in range(len(internal) + 1):
        turns = internal[dropped:]
        messages = chat.build_messages(turns, None if continue_last else "Last question?", state)
        prompt = chat.render_messages(messages, state, continue_last=continue_last)
        if len(turns) <= continue_last or get_encoded_length(prompt) <= get_max_prompt_length(state):
            return prompt


def test_a_turn_streams_and_lands_in_both_histories(llama):
    state = llama.greedy_state(max_new_tokens=6, ban_eos_token=True)
    outputs = list(chat.chatbot_wrapper("Hello <i>there</i>", state))
    assert outputs[0]["visible"][-1][1] == shared.processing_message
    final = outputs[-1]
    assert final["internal"][-1][0] == "Hello <i>there</i>"
    assert final["visible"][-1][0] == "Hello &lt;i&gt;there&lt;/i&gt;"
    assert final["internal"][-1][1] and len(outputs) > 3
    assert state["history"] == {"internal": [], "visible": []}, "the caller's history is not mutated"


def test_regenerate_replaces_the_last_reply(llama):
    state = llama.greedy_state(max_new_tokens=6, ban_eos_token=True)
    first = list(chat.generate_chat_reply("Hello", state))[-1]
    again = list(chat.generate_chat_reply("", llama.greedy_state(max_new_tokens=6, ban_eos_token=True, history=first),
                                          regenerate=True))[-1]
    assert len(again["internal"]) == 1 and again["internal"] == first["internal"]


def test_remove_last(llama):
    text, history = chat.remove_last_message(history_of(3))
    assert text == "Question number 2 about a red circle?" and len(history["internal"]) == 2


def test_notices_show_in_the_visible_reply_only(llama):
    assert chat.notices_html(["Removed 1 image(s) <x>"]) == "\n\n⚠ Removed 1 image(s) &lt;x&gt;"


def test_save_and_load_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "HISTORY_DIR", tmp_path)
    history = history_of(2)
    path = chat.save_history(history, "my chat/../x")
    assert path.parent == tmp_path and path.exists()
    assert chat.load_history(path) == history
    assert path.stem in chat.list_saved_histories()
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"internal": []}', "'internal' and 'visible'"),
    ('{"internal": [["a"]], "visible": [["a", "b"]]}', "string pairs"),
    ('{"internal": [], "visible": [["a", "b"]]}', "turns"),
    ("[1, 2]", "JSON object"),
])
def test_a_corrupted_history_is_a_clear_error_and_the_file_is_kept(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(chat.ChatHistoryError, match=message):
        chat.load_history(path)
    assert path.read_text() == content


def slow_save(path_dir: str, ready) -> None:
    chat.HISTORY_DIR = __import__("pathlib").Path(path_dir)
    big = {"internal": [["x" * 1000, "y" * 1000]] * 20000, "visible": [["x", "y"]] * 20000}
    ready.set()
    chat.save_history(big, "chat")


def test_a_process_killed_while_saving_leaves_the_previous_history(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "HISTORY_DIR", tmp_path)
    previous = history_of(2)
    path = chat.save_history(previous, "chat")
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        ready = ctx.Event()
        proc = ctx.Process(target=slow_save, args=(str(tmp_path), ready))
        proc.start()
        ready.wait(30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        loaded = json.loads(path.read_text())
        assert loaded in (previous, ) or len(loaded["internal"]) == 20000, "never a half-written file"
        if loaded == previous:
            break
    assert chat.load_history(path)["internal"]


def test_pictures_no_extension_takes_are_refused(host, llama_dir):
    host.load(llama_dir)
    state = host.greedy_state(message_images=[b"any picture"])
    with pytest.raises(chat.ImagesNotTakenError, match="cannot take images"):
        list(chat.generate_chat_reply("What is this?", state))
