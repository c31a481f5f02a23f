"""Extension loading and hook semantics, with extensions written into a temporary folder."""
from __future__ import annotations

import copy
import logging
import sys
import textwrap

import pytest
import torch

import extensions as extensions_package
from modules import chat, extensions, shared
from modules.text_generation import encode, generate_reply

RECORDER = '''
import torch
calls = []
params = {"flag": "default"}

def setup():
    calls.append(("setup", params["flag"]))

def history_modifier(history):
    calls.append(("history", len(history["internal"])))
    return history

def state_modifier(state):
    calls.append(("state", state["max_new_tokens"]))
    return state

def chat_input_modifier(text, visible_text, state):
    calls.append(("chat_input", text, visible_text))
    return text + " [seen]", visible_text + " [shown]"

def input_modifier(string, state, is_chat=False):
    calls.append(("input", string, is_chat))
    return string

def tokenizer_modifier(state, prompt, input_ids, input_embeds):
    calls.append(("tokenizer", prompt, tuple(input_ids.shape), input_embeds))
    return prompt, input_ids, input_embeds

def logits_processor_modifier(processor_list, input_ids):
    calls.append(("logits_processor", type(processor_list).__name__, tuple(input_ids.shape)))
    return processor_list

def output_modifier(string, state, is_chat=False):
    calls.append(("output", string, is_chat))
    return string + " [out]"
'''

SWAP_EMBEDS = '''
import torch
from modules import shared
from modules.text_generation import encode
params = {"other_prompt": "", "fill_id": None}

def tokenizer_modifier(state, prompt, input_ids, input_embeds):
    ids = encode(params["other_prompt"])
    embeds = shared.model.get_input_embeddings()(ids)
    if params["fill_id"] is not None:  # ids that say nothing about the content, e.g. the pad id
        ids = torch.full_like(ids, params["fill_id"])
    return prompt, ids, embeds
'''


@pytest.fixture
def ext_dir(tmp_path):
    extensions_package.__path__.append(str(tmp_path))
    yield tmp_path
    extensions_package.__path__.remove(str(tmp_path))


def write_extension(root, name: str, code: str) -> None:
    (root / name).mkdir()
    (root / name / "script.py").write_text(textwrap.dedent(code))


def test_broken_extensions_are_logged_and_skipped(host, llama_dir, ext_dir, caplog):
    write_extension(ext_dir, "broken_import", "raise RuntimeError('boom at import')\n")
    write_extension(ext_dir, "broken_setup", "def setup():\n    raise ValueError('boom in setup')\n")
    write_extension(ext_dir, "recorder", RECORDER)
    with caplog.at_level(logging.ERROR):
        host.load(llama_dir, ["broken_import", "broken_setup", "recorder", "missing_one"])
    assert list(extensions.state) == ["recorder"]
    assert "boom at import" in caplog.text and "boom in setup" in caplog.text
    assert 'Extension "missing_one" not found' in caplog.text
    assert "Traceback" in caplog.text


def test_hooks_are_called_in_order_with_documented_arguments(host, llama_dir, ext_dir):
    write_extension(ext_dir, "recorder", RECORDER)
    host.load(llama_dir, ["recorder"], settings={"recorder-flag": "from-settings"})
    recorder = sys.modules["extensions.recorder.script"]
    assert recorder.calls == [("setup", "from-settings")]
    state = host.greedy_state(max_new_tokens=4)
    history = list(chat.chatbot_wrapper("Hi <b>", state))[-1]
    names = [c[0] for c in recorder.calls]
    assert names == ["setup", "history", "state", "chat_input", "input", "tokenizer", "logits_processor", "output"]
    chat_input = recorder.calls[3]
    assert chat_input == ("chat_input", "Hi <b>", "Hi &lt;b&gt;")
    assert recorder.calls[4] == ("input", "Hi <b> [seen]", True)
    _, prompt, shape, embeds = recorder.calls[5]
    assert "Hi <b> [seen]" in prompt and shape[0] == 1 and embeds is None
    assert history["internal"][-1][0] == "Hi <b> [seen]"
    assert history["visible"][-1][0] == "Hi &lt;b&gt; [shown]"
    assert history["visible"][-1][1].endswith(" [out]")


def test_returned_embeddings_drive_generation(host, llama_dir, ext_dir):
    write_extension(ext_dir, "swap", SWAP_EMBEDS)
    other = "The quick brown fox jumps over"
    host.load(llama_dir, ["swap"], settings={"swap-other_prompt": other})
    state = host.greedy_state(max_new_tokens=10, ban_eos_token=True)
    swapped = list(generate_reply("Hello world", state))[-1]
    extensions.reset()
    direct_other = list(generate_reply(other, dict(state)))[-1]
    direct_asked = list(generate_reply("Hello world", dict(state)))[-1]
    assert swapped == direct_other
    assert swapped != direct_asked, "the embeddings, not the prompt text, decide the output"


def test_embeddings_drive_generation_when_every_id_is_the_pad_id(host, llama_dir, ext_dir):
    write_extension(ext_dir, "swap", SWAP_EMBEDS)
    other = "The quick brown fox jumps over"
    host.load(llama_dir, ["swap"])
    sys.modules["extensions.swap.script"].params.update(other_prompt=other, fill_id=shared.tokenizer.pad_token_id)
    state = host.greedy_state(max_new_tokens=10, ban_eos_token=True)
    swapped = list(generate_reply("Hello world", state))[-1]
    ids = encode(other)
    embeds = shared.model.get_input_embeddings()(ids)
    direct = shared.model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                                   do_sample=False, suppress_tokens=[shared.tokenizer.eos_token_id],
                                   pad_token_id=shared.tokenizer.pad_token_id)
    assert swapped == shared.tokenizer.decode(direct[0], skip_special_tokens=True)


def test_apply_extensions_rejects_unknown_hook_types():
    with pytest.raises(ValueError, match="Unknown extension hook type"):
        extensions.apply_extensions("nonsense")


def test_example_extension_loads_and_documents_hooks(host, llama_dir):
    host.load(llama_dir, ["example"])
    assert "example" in extensions.state
    example = sys.modules["extensions.example.script"]
    for hook in ["setup", "ui", "chat_input_modifier", "input_modifier", "tokenizer_modifier",
                 "logits_processor_modifier", "output_modifier", "history_modifier", "state_modifier"]:
        assert hook in example.__doc__ and callable(getattr(example, hook))
    state = host.greedy_state(max_new_tokens=3)
    assert list(chat.chatbot_wrapper("Hello", state))[-1]["internal"][-1][0] == "Hello"


# custom_generate_reply: text-generation-webui's `_generate_reply` calls the first extension's function
# with (question, original_question, state, stopping_strings, is_chat=...) and treats what it yields
# as the model's cumulative reply.
CUSTOM_REPLY = '''
calls = []
pulled = []
params = {"replies": ["Hel", "Hello", "Hello <b>"]}

def input_modifier(string, state, is_chat=False):
    return string if is_chat else string + " [in]"

def custom_generate_reply(question, original_question, state, stopping_strings, *args, **kwargs):
    calls.append({"question": question, "original_question": original_question, "state": state,
                  "stopping_strings": stopping_strings, "args": args, "kwargs": kwargs})
    try:
        for reply in params["replies"]:
            pulled.append(reply)
            yield reply
    finally:
        pulled.append("closed")

def output_modifier(string, state, is_chat=False):
    return string + " [out]"
'''

# The hook offered by a module-level __getattr__, only while params["offer"] is set.
OFFERED = '''
params = {"offer": False}

def _reply(question, original_question, state, stopping_strings, is_chat=False):
    yield "from the extension"

def __getattr__(name):
    if name == "custom_generate_reply" and params["offer"]:
        return _reply
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
'''

DELEGATE = '''
from modules.text_generation import generate_reply_HF
calls = []

def custom_generate_reply(question, original_question, state, stopping_strings, is_chat=False):
    calls.append(question)
    for reply in generate_reply_HF(question, original_question, state, stopping_strings, is_chat=is_chat):
        yield reply.upper()
'''


def model_reply(prompt: str, max_new_tokens: int) -> str:
    """The tiny model's greedy reply, from `model.generate` itself (EOS banned)."""
    ids = encode(prompt)
    out = shared.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, suppress_tokens=[shared.tokenizer.eos_token_id],
                                pad_token_id=shared.tokenizer.pad_token_id)
    return shared.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_custom_generate_reply_generates_a_chat_turn(host, llama_dir, ext_dir):
    write_extension(ext_dir, "custom", CUSTOM_REPLY)
    host.load(llama_dir, ["custom"])
    custom = sys.modules["extensions.custom.script"]
    state = host.greedy_state(max_new_tokens=4)
    turns = [copy.deepcopy(t) for t in chat.chatbot_wrapper("Hi there", state, loading_message=False)]
    [call] = custom.calls
    assert call["state"] is state and call["args"] == () and call["kwargs"] == {"is_chat": True}
    assert "Hi there" in call["question"] and call["original_question"] == call["question"]
    assert call["stopping_strings"] == chat.get_stopping_strings(state)
    assert [t["internal"][-1][1] for t in turns[:3]] == ["Hel", "Hello", "Hello <b>"]  # streamed
    assert turns[-1]["internal"][-1] == ["Hi there", "Hello <b>"]
    assert turns[-1]["visible"][-1][1] == "Hello &lt;b&gt; [out]"
    assert custom.pulled[-1] == "closed"
    stats = state["generation_stats"]
    assert stats["prompt_tokens"] == encode(call["question"]).shape[1]
    assert stats["completion_tokens"] == encode("Hello <b>", add_special_tokens=False).shape[1]
    assert state["notices"] == []


def test_custom_generate_reply_in_plain_generation_gets_the_modified_prompt(host, llama_dir, ext_dir):
    write_extension(ext_dir, "custom", CUSTOM_REPLY)
    host.load(llama_dir, ["custom"])
    custom = sys.modules["extensions.custom.script"]
    replies = list(generate_reply("Once upon", host.greedy_state()))
    [call] = custom.calls
    assert (call["question"], call["original_question"]) == ("Once upon [in]", "Once upon")
    assert call["kwargs"] == {"is_chat": False} and call["stopping_strings"] is None
    assert replies == ["Hel", "Hello", "Hello <b>", "Hello <b> [out]"]


def test_host_applies_stopping_strings_to_custom_replies(host, llama_dir, ext_dir):
    write_extension(ext_dir, "custom", CUSTOM_REPLY)
    host.load(llama_dir, ["custom"])
    custom = sys.modules["extensions.custom.script"]
    custom.params["replies"] = ["Hel", "Hello\nYo", "Hello\nYou: more", "never pulled"]
    state = host.greedy_state()
    replies = list(generate_reply("Hi", state, stopping_strings=["\nYou:"]))
    assert replies == ["Hel", "Hello", "Hello [out]"]  # "\nYo" may start the stop: held back
    assert custom.pulled == ["Hel", "Hello\nYo", "Hello\nYou: more", "closed"]
    assert state["generation_stats"]["finish_reason"] == "stop"
    custom.params["replies"] = ["a", "ab END", "ab END more"]
    state = host.greedy_state(custom_stopping_strings='"END"')
    assert list(generate_reply("Hi", state))[-1] == "ab  [out]"


def test_stop_button_ends_a_custom_reply_and_frees_the_lock(host, llama_dir, ext_dir):
    write_extension(ext_dir, "custom", CUSTOM_REPLY)
    host.load(llama_dir, ["custom"])
    custom = sys.modules["extensions.custom.script"]
    custom.params["replies"] = ["x" * n for n in range(1, 1000)]
    seen = []
    for reply in generate_reply("Hi", host.greedy_state()):
        seen.append(reply)
        if len(seen) == 3:
            shared.stop_everything = True
    assert seen == ["x", "xx", "xxx", "xxx [out]"]
    assert custom.pulled[-1] == "closed" and not shared.generation_lock.locked()


def test_a_withdrawn_custom_generate_reply_leaves_the_host_generating(host, llama_dir, ext_dir):
    write_extension(ext_dir, "offered", OFFERED)
    host.load(llama_dir, ["offered"])
    offered = sys.modules["extensions.offered.script"]
    assert not hasattr(offered, "custom_generate_reply")
    state = host.greedy_state(max_new_tokens=10, ban_eos_token=True)
    expected = model_reply("Hello world", 10)
    assert list(generate_reply("Hello world", dict(state)))[-1] == expected
    offered.params["offer"] = True  # looked up on every generation, not once at load
    assert list(generate_reply("Hello world", dict(state)))[-1] == "from the extension"
    offered.params["offer"] = False
    assert list(generate_reply("Hello world", state))[-1] == expected
    assert state["generation_stats"]["completion_tokens"] == 10


def test_custom_generate_reply_can_delegate_to_the_hosts_generation(host, llama_dir, ext_dir):
    write_extension(ext_dir, "delegate", DELEGATE)
    host.load(llama_dir, ["delegate"])
    state = host.greedy_state(max_new_tokens=10, ban_eos_token=True, max_updates_second=0)
    replies = list(generate_reply("Hello world", state))
    assert sys.modules["extensions.delegate.script"].calls == ["Hello world"]
    assert replies[-1] == model_reply("Hello world", 10).upper()
    assert len(replies) > 2 and all(later.startswith(earlier) for earlier, later in zip(replies, replies[1:]))
    stats = state["generation_stats"]  # exact counts, recorded by the host's own generation
    assert stats["completion_tokens"] == 10 and stats["prompt_tokens"] == encode("Hello world").shape[1]
