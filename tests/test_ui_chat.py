"""The chat UI's wiring and handlers, without a browser: Blocks built for real, handlers called directly.

A harness extension (written into a temporary extensions folder) registers a per-message input and
can make generation fail on demand; the model is the tiny Llama fixture.
"""
from __future__ import annotations

import html
import importlib
import json
import textwrap
import warnings

import gradio as gr
import pytest

import extensions as extensions_package
from modules import chat, extensions, shared, ui_chat

HARNESS = '''
import gradio as gr
from modules import shared

seen = []

def ui():
    box = gr.Textbox(label="note", elem_id="harness-note")
    shared.gradio["extension_inputs"]["harness_note"] = box
    shared.gradio["harness_note"] = box

def chat_input_modifier(text, visible_text, state):
    seen.append(state.get("harness_note"))
    return text, visible_text

def tokenizer_modifier(state, prompt, input_ids, input_embeds):
    if "FAIL-VALUE" in prompt:
        raise ValueError("3 images but this model takes at most 2: send fewer images")
    if "FAIL-RUNTIME" in prompt:
        raise RuntimeError("CUDA out of memory in embed_images")
    return prompt, input_ids, input_embeds
'''


def loaded_extension(host, llama_dir, tmp_path, name: str, source: str):
    """The extension `name` (its script.py is `source`), loaded with the tiny Llama; yields its module."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "script.py").write_text(textwrap.dedent(source))
    extensions_package.__path__.append(str(tmp_path))
    try:
        host.load(llama_dir, [name])
        yield importlib.import_module(f"extensions.{name}.script")
    finally:
        extensions_package.__path__.remove(str(tmp_path))


@pytest.fixture
def harness(host, llama_dir, tmp_path):
    yield from loaded_extension(host, llama_dir, tmp_path, "harness_ext", HARNESS)


def params(max_new_tokens: int = 8) -> list:
    """Greedy values for PARAMETER_KEYS (temperature 0 turns sampling off)."""
    return [max_new_tokens, 0.0, 1.0, shared.settings["truncation_length"]]


def last(stream):
    outputs = list(stream)
    assert outputs, "a handler must yield at least once"
    return outputs


def quiet(stream):
    """Run a handler that may call gr.Warning outside a request (it then becomes a Python warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = last(stream)
    return outputs, [str(w.message) for w in caught]


def test_interface_registers_the_documented_components(llama):
    interface = ui_chat.create_interface()
    assert isinstance(interface, gr.Blocks)
    for key in ["textbox", "Generate", "Stop", "Regenerate", "Remove last", "Clear history", "history", "display",
                "max_new_tokens", "temperature", "top_p", "truncation_length", "save_name", "Save history",
                "saved_histories", "Load history", "interface"]:
        assert key in shared.gradio, key
    assert isinstance(shared.gradio["textbox"], gr.Textbox) and isinstance(shared.gradio["Generate"], gr.Button)
    assert shared.gradio["extension_inputs"] == {}
    assert "#chat-history" in ui_chat.interface_css()


def dependency(config: dict, target_id: int, event: str) -> dict:
    found = [d for d in config["dependencies"] if [target_id, event] in [list(t) for t in d["targets"]]]
    assert len(found) == 1, f"expected one {event} handler on component {target_id}, found {len(found)}"
    return found[0]


def test_send_reads_and_clears_inputs_before_generating(harness):
    """Generate and Enter: one unqueued step takes text + extension inputs and clears them, then generate."""
    interface = ui_chat.create_interface()
    config = interface.get_config_file()
    g = shared.gradio
    assert g["extension_inputs"] == {"harness_note": g["harness_note"]}
    textbox, note = g["textbox"]._id, g["harness_note"]._id
    for target, event in ((g["Generate"]._id, "click"), (textbox, "submit")):
        claim = dependency(config, target, event)
        assert interface.fns[claim["id"]].fn is ui_chat.start_reply and claim["queue"] is not False
        first = next(d for d in config["dependencies"] if d["trigger_after"] == claim["id"])
        assert first["trigger_only_on_success"], "a refused claim (a reply pending) must not take the inputs"
        assert first["queue"] is False and first["inputs"] == [textbox, g["history"]._id, note]
        assert first["outputs"][-2:] == [textbox, note]
        text_state, turns_state, note_state = first["outputs"][:3]
        then = [d for d in config["dependencies"] if d["trigger_after"] == first["id"]]
        assert len(then) == 1
        assert then[0]["inputs"][0] == text_state and then[0]["inputs"][-1] == note_state
        assert g["display"]._id in then[0]["outputs"] and g["history"]._id in then[0]["outputs"]
        assert interface.fns[first["id"]].fn is ui_chat.take_inputs
        restore = [d for d in config["dependencies"] if d["trigger_after"] == then[0]["id"]]
        assert interface.fns[restore[0]["id"]].fn is ui_chat.restore_unsent
        assert restore[0]["inputs"] == [text_state, g["history"]._id, turns_state, note_state, note]
        assert restore[0]["outputs"] == [textbox, note]
    empty = chat.new_history()
    assert ui_chat.take_inputs("hi", empty, ["a.png"]) == ("hi", 0, ["a.png"], "", None)
    assert ui_chat.take_inputs("hi", empty, []) == ("hi", 0, None, "", None)


def test_a_message_whose_turn_failed_goes_back_with_its_pictures(host):
    """Its words to the textbox, each extension input's value to its input (unless the user put
    something new there meanwhile); a message that became a turn changes nothing."""
    extensions.state["multimodal"] = [True, 0]  # the extension that writes image tags (its hooks only)
    one_turn = {"internal": [["Hi", "Hello."]], "visible": [["Hi", "Hello."]]}
    tag = '<img src="data:image/jpeg;base64,AAAA">'
    assert ui_chat.restore_unsent(None, f"{tag}What is this?", one_turn, 1, ["a.png"], None) == ("What is this?", ["a.png"])
    assert ui_chat.restore_unsent(None, "What?", one_turn, 1, ["a.png"], ["b.png"]) == ("What?", gr.update())
    assert ui_chat.restore_unsent(None, "What?", one_turn, 1, None, None) == ("What?", gr.update())
    assert ui_chat.restore_unsent(None, "What is this?", one_turn, 0, ["a.png"], None) == (gr.update(), gr.update())
    assert ui_chat.restore_unsent(None, "What?", one_turn, 1) == "What?", "the textbox alone: its value bare"


def test_generate_streams_the_same_reply_as_the_chat_module(llama):
    outputs = last(ui_chat.generate("Hello <b>there</b>", chat.new_history(), *params(8)))
    assert len(outputs) > 2, "the reply streams"
    display, history = outputs[-1]
    assert "Hello &lt;b&gt;there&lt;/b&gt;" in display
    state = llama.greedy_state(max_new_tokens=8)
    direct = list(chat.generate_chat_reply("Hello <b>there</b>", state))[-1]
    assert history["internal"] == direct["internal"] and history["visible"] == direct["visible"]
    assert history["internal"][0][0] == "Hello <b>there</b>" and history["internal"][0][1]


def test_extension_inputs_reach_the_state(harness):
    ui_chat.create_interface()
    last(ui_chat.generate("Hello", chat.new_history(), *params(2), "a note"))
    assert harness.seen == ["a note"]
    state = ui_chat.state_from_values(chat.new_history(), *params(2), None)
    assert state["harness_note"] is None and state["notices"] == []
    with pytest.raises(ValueError, match="handler got 3 values"):
        ui_chat.state_from_values(chat.new_history(), 1, 2, 3)


def test_empty_input_adds_no_turn(harness):
    ui_chat.create_interface()
    outputs = last(ui_chat.generate("   ", chat.new_history(), *params(2), None))
    assert outputs == [(outputs[0][0], chat.new_history())] and harness.seen == []
    # An image-only message (an extension input and no text) is a message.
    assert last(ui_chat.generate("", chat.new_history(), *params(2), "only a note"))[-1][1]["internal"]


@pytest.mark.parametrize("trigger, shown", [
    ("FAIL-VALUE", "3 images but this model takes at most 2: send fewer images"),
    ("FAIL-RUNTIME", "CUDA out of memory in embed_images"),
])
def test_generation_errors_become_a_notice_and_keep_the_history(harness, trigger, shown):
    ui_chat.create_interface()
    first = last(ui_chat.generate("Hi", chat.new_history(), *params(3), None))[-1][1]
    before = json.loads(json.dumps(first))
    outputs, warned = quiet(ui_chat.generate(f"please {trigger}", first, *params(3), None))
    display, history = outputs[-1]
    assert history == before, "the failed turn leaves the history as it was"
    assert html.escape(shown) in display and 'class="notice"' in display
    assert any(shown in w for w in warned)
    assert not shared.generation_lock.locked()
    after = last(ui_chat.generate("And now?", history, *params(3), None))[-1][1]
    assert len(after["internal"]) == 2 and after["internal"][0] == before["internal"][0]
    assert 'class="notice"' not in last(ui_chat.generate("Again", after, *params(2), None))[-1][0]


def test_regenerate_remove_last_and_clear(llama):
    history = last(ui_chat.generate("Hello", chat.new_history(), *params(6)))[-1][1]
    again = last(ui_chat.regenerate(history, *params(6)))[-1][1]
    assert again == history, "greedy regeneration gives the same reply"
    extensions.state["multimodal"] = [True, 0]  # the extension that writes image tags (its hooks only)
    tag = '<img src="data:image/jpeg;base64,AAAA">'
    with_image = {"internal": [[f"{tag}\nWhat is it?", "A cat."]], "visible": [[f"{tag}\nWhat is it?", "A cat."]]}
    display, removed, text = ui_chat.remove_last(None, with_image)
    assert removed == chat.new_history() and text == "What is it?" and "No messages yet" in display
    assert ui_chat.clear_history(None)[1] == chat.new_history()


def test_regenerate_on_an_empty_history_does_nothing(llama):
    assert last(ui_chat.regenerate(chat.new_history(), *params(4)))[-1][1] == chat.new_history()


def test_no_model_loaded_keeps_the_history(host):
    shared.model = None
    outputs, warned = quiet(ui_chat.generate("Hello", chat.new_history(), *params(4)))
    assert outputs[-1][1] == chat.new_history() and any("No model is loaded" in w for w in warned)


def test_save_and_load_round_trip(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "HISTORY_DIR", tmp_path)
    history = {"internal": [["<script>x</script>", "ok"]], "visible": [["<script>x</script>", "<b>ok</b>"]]}
    update = ui_chat.save(history, "my chat")
    assert update["value"] == "my_chat" and "my_chat" in update["choices"]
    display, loaded = ui_chat.load(None, chat.new_history(), "my_chat")
    assert loaded == history
    assert "&lt;script&gt;x&lt;/script&gt;" in display and "&lt;b&gt;ok&lt;/b&gt;" in display and "<b>" not in display
    (tmp_path / "broken.json").write_text("{not json")
    outputs, warned = quiet((ui_chat.load(None, history, name) for name in ["broken"]))
    display, kept = outputs[-1]
    assert kept is history and "not valid JSON" in display and any("not valid JSON" in w for w in warned)


# -- Per-message extension options, and the context meter ------------------------------------------

OPTION_HARNESS = '''
import gradio as gr
from modules import shared

seen = []

def ui():
    shared.gradio["extension_inputs"]["harness_note"] = gr.Textbox(label="note")
    shared.gradio["harness_level"] = gr.Radio(["a", "b"], value="a", label="level")
    shared.gradio["extension_options"]["harness_level"] = shared.gradio["harness_level"]

def state_modifier(state):
    seen.append((state.get("harness_note"), state.get("harness_level")))
    return state
'''


@pytest.fixture
def option_harness(host, llama_dir, tmp_path):
    yield from loaded_extension(host, llama_dir, tmp_path, "option_ext", OPTION_HARNESS)


def handlers(interface, fn) -> list[dict]:
    config = interface.get_config_file()
    return [d for d in config["dependencies"] if interface.fns[d["id"]].fn is fn]


def test_an_option_is_read_with_every_send_and_regenerate_but_never_cleared(option_harness):
    interface = ui_chat.create_interface()
    level = shared.gradio["harness_level"]._id
    assert list(shared.gradio["extension_options"]) == ["harness_level"]
    for send in handlers(interface, ui_chat.take_inputs):
        assert level not in send["inputs"] and level not in send["outputs"]
    for reader in (ui_chat.send, ui_chat.regenerate_in_session, ui_chat.context_meter):
        found = handlers(interface, reader)
        assert found and all(d["inputs"][-1] == level for d in found), reader.__name__
    # values: parameters, then the inputs, then the options
    history = last(ui_chat.generate("Hi", chat.new_history(), *params(2), None, "b"))[-1][1]
    assert option_harness.seen == [(None, "b")] and len(history["internal"]) == 1
    last(ui_chat.regenerate(history, *params(2), "a"))
    assert option_harness.seen[-1] == (None, "a")


def test_an_option_alone_is_no_message(option_harness):
    ui_chat.create_interface()
    outputs = last(ui_chat.generate("  ", chat.new_history(), *params(2), None, "b"))
    assert outputs[-1][1] == chat.new_history() and option_harness.seen == []
    with pytest.raises(ValueError, match="then 0 or 1 extension options"):
        ui_chat.state_from_values(chat.new_history(), *params(2), None, "b", "extra")


def test_the_context_meter_counts_the_next_prompt_as_the_tokenizer_does(llama):
    interface = ui_chat.create_interface()
    meter = shared.gradio["context_meter"]
    assert meter.elem_id == "context-meter" and meter.value.startswith("Context: ")
    history = last(ui_chat.generate("Hello there", chat.new_history(), *params(4)))[-1][1]
    # The oracle: Hugging Face's tokenizer on the same turns plus an empty user message. The host's measure
    # (get_encoded_length, what truncation uses) counts a BOS where the template writes none, as
    # text-generation-webui's does; this tiny template writes none.
    messages = [{"role": r, "content": c} for user, bot in history["internal"]
                for r, c in (("user", user), ("assistant", bot))] + [{"role": "user", "content": ""}]
    ids = shared.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
    assert ids[0] != shared.tokenizer.bos_token_id
    expected = len(ids) + 1
    limit = shared.settings["truncation_length"]
    assert ui_chat.context_meter(history, *params(4)) == f"Context: {expected} / {limit} tokens"
    # Measured after a turn, Regenerate, Remove last, Clear and Load, and when the two lengths change.
    measured_after = {d["trigger_after"] for d in handlers(interface, ui_chat.context_meter)}
    functions = {interface.fns[i].fn for i in measured_after if i is not None}
    assert functions == {ui_chat.restore_unsent, ui_chat.regenerate_in_session, ui_chat.remove_last,
                         ui_chat.clear_history, ui_chat.load}
    triggers = {tuple(t) for d in handlers(interface, ui_chat.context_meter) for t in d["targets"]}
    for name in ("max_new_tokens", "truncation_length"):
        assert (shared.gradio[name]._id, "change") in triggers


def test_the_context_meter_is_empty_without_a_model(host):
    shared.model = None
    assert ui_chat.context_meter(chat.new_history(), *params(4)) == ""


def test_the_context_meter_counts_a_picture_attached_but_not_yet_sent(host, tmp_path):
    """The meter is most useful before sending: a picture waiting in the image input counts at its real
    cost. The oracle is the turn itself: sending that picture (no text) uses exactly the tokens the meter
    showed while it waited. The demo model is the one a new user sees this on."""
    import random

    from tests.conftest import ROOT
    from tools.demo_model.pictures import draw_scene, random_scene

    demo = ROOT / "models" / shared.DEMO_MODEL
    if not (demo / "config.json").exists():
        pytest.skip(f"{demo} is absent: run python -m tools.demo_model.train")
    rng = random.Random(7)
    picture = tmp_path / "red-circle.png"
    draw_scene(random_scene(rng, kinds=[("red", "circle")]), rng, size=(200, 160)).save(picture)
    host.load(demo, ["multimodal"])
    interface = ui_chat.create_interface()
    assert ui_chat.extension_input_keys() == ["message_images"]
    history = chat.new_history()
    empty = ui_chat.context_meter(history, *params(4), None, "default")
    waiting = ui_chat.context_meter(history, *params(4), [str(picture)], "default")
    state = ui_chat.state_from_values(history, *params(4), [str(picture)], "default")
    for _ in chat.generate_chat_reply("", state):
        pass
    used, limit = state["generation_stats"]["prompt_tokens"], shared.settings["truncation_length"]
    assert waiting == f"Context: {used} / {limit} tokens" and empty != waiting, (empty, waiting, used)
    # Measured again when a picture is attached or removed, or its budget changes, not only after a send.
    triggers = {tuple(t) for d in handlers(interface, ui_chat.context_meter) for t in d["targets"]}
    for component in (shared.gradio["message_images"], shared.gradio["multimodal_budget"]):
        assert (component._id, "change") in triggers


# -- One reply at a time per session --------------------------------------------------------------

def test_a_session_writing_a_reply_refuses_what_would_overwrite_its_history(llama):
    """While a session's reply is pending, its second send (its text stays: nothing was taken), Regenerate,
    Remove last, Clear and Load are refused with the reason; another session is not held up. The send's
    last step frees the session."""
    one, other = gr.Request(session_hash="one"), gr.Request(session_hash="other")
    empty = chat.new_history()
    ui_chat.start_reply(one)
    try:
        for refused in (lambda: ui_chat.start_reply(one),
                        lambda: last(ui_chat.regenerate_in_session(one, empty, *params(4))),
                        lambda: ui_chat.remove_last(one, empty), lambda: ui_chat.clear_history(one),
                        lambda: ui_chat.load(one, empty, "saved")):
            with pytest.raises(gr.Error, match="A reply is still being written"):
                refused()
        ui_chat.start_reply(other)
        ui_chat.restore_unsent(other, "elsewhere", empty, 0)
    finally:
        ui_chat.restore_unsent(one, "first", empty, 0)
    ui_chat.start_reply(one)
    ui_chat.restore_unsent(one, "second", empty, 0)
    # Regenerate holds the session while it streams, and frees it when it ends.
    stream = ui_chat.regenerate_in_session(one, empty, *params(4))
    next(stream)
    with pytest.raises(gr.Error):
        ui_chat.clear_history(one)
    list(stream)
    assert ui_chat.clear_history(one)[1] == empty
