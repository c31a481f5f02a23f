"""One chat turn for the UI and the API: the same hooks, in text-generation-webui's order, and the same reply.

A recording extension (written into a temporary extensions folder, loaded before the multimodal
extension on a fake pipeline) notes every hook it is called through. The same message - text only,
and with a picture - is sent through the UI's chat function (`ui_chat.generate`, which the handler Gradio calls, `send`, runs)
and through `/v1/chat/completions`, streaming and not. A completion (`/v1/completions`) meets
text-generation-webui's `generate_reply` hooks: state and input, then tokenizer on.
"""
from __future__ import annotations

import textwrap

import pytest

import extensions as extensions_package
from modules import chat, shared, ui_chat
from fixtures import api_helpers
from tests.conftest import ROOT

RECORDER = '''
calls = []

def history_modifier(history):
    calls.append("history")
    return history

def state_modifier(state):
    calls.append("state")
    return state

def chat_input_modifier(text, visible_text, state):
    calls.append("chat_input")
    return text, visible_text

def input_modifier(string, state, is_chat=False):
    calls.append("input")
    return string

def custom_generate_chat_prompt(user_input, state, **kwargs):
    calls.append("custom_generate_chat_prompt")
    return None  # the host builds the prompt

def bot_prefix_modifier(string, state):
    calls.append("bot_prefix")
    return string

def tokenizer_modifier(state, prompt, input_ids, input_embeds):
    calls.append("tokenizer")
    return prompt, input_ids, input_embeds

def logits_processor_modifier(processor_list, input_ids):
    calls.append("logits_processor")
    return processor_list

def output_modifier(string, state, is_chat=False):
    calls.append("output")
    return string
'''
# text-generation-webui's order (modules/chat.py: chatbot_wrapper, generate_chat_prompt; text_generation.py)
ORDER = ["history", "state", "chat_input", "input", "custom_generate_chat_prompt", "bot_prefix", "tokenizer",
         "logits_processor", "output"]
# text-generation-webui's generate_reply for a prompt that is not a chat turn
COMPLETION_ORDER = ["state", "input", "tokenizer", "logits_processor", "output"]
GREEDY = {"model": "local", "max_tokens": 6, "temperature": 0, "extra_body": {"ban_eos_token": True}}


@pytest.fixture(scope="module")
def served(llama_dir, tmp_path_factory):
    from fixtures import host_helpers

    folder = tmp_path_factory.mktemp("ext")
    (folder / "recorder").mkdir()
    (folder / "recorder" / "script.py").write_text(textwrap.dedent(RECORDER))
    extensions_package.__path__.append(str(folder))
    saved = host_helpers.snapshot()
    try:
        host_helpers.load(llama_dir, ["recorder", "multimodal"], argv=["--multimodal-pipeline", "fake-linear"],
                          settings={"multimodal-pipeline_dirs": [str(ROOT / "tests" / "multimodal_pipelines")],
                                    "max_new_tokens": GREEDY["max_tokens"], "ban_eos_token": True})
        ui_chat.create_interface()  # the extensions' UIs register their per-message inputs
        import extensions.recorder.script as recorder

        api = api_helpers.start_api()
        try:
            yield recorder, api
        finally:
            api.stop()
    finally:
        shared.gradio.clear()
        extensions_package.__path__.remove(str(folder))
        host_helpers.restore(saved)


def through_ui(recorder, text: str, picture) -> tuple[list[str], str]:
    recorder.calls.clear()
    values = [GREEDY["max_tokens"], 0.0, 1.0, shared.settings["truncation_length"]]
    images = [str(picture)] if picture else None
    history = list(ui_chat.generate(text, chat.new_history(), *values, images))[-1][1]
    return list(recorder.calls), history["internal"][-1][1]


def message(text: str, picture) -> dict:
    if not picture:
        return {"role": "user", "content": text}
    url = api_helpers.data_url(picture.read_bytes())
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}


def through_api(recorder, api, text: str, picture, stream: bool) -> tuple[list[str], str]:
    recorder.calls.clear()
    result = api.client().chat.completions.create(messages=[message(text, picture)], stream=stream, **GREEDY)
    reply = "".join(c.choices[0].delta.content or "" for c in result if c.choices) if stream else \
        result.choices[0].message.content
    return list(recorder.calls), reply


@pytest.mark.parametrize("with_picture", [False, True], ids=["text", "picture"])
def test_the_ui_and_the_api_run_the_same_hooks_in_order_and_reply_alike(served, tmp_path, with_picture):
    recorder, api = served
    picture = None
    if with_picture:
        picture = tmp_path / "picture.png"
        picture.write_bytes(api_helpers.image_bytes("blue", "square"))
    calls, reply = through_ui(recorder, "What is in the picture?", picture)
    assert calls == ORDER
    assert reply.strip()
    for stream in (False, True):
        assert through_api(recorder, api, "What is in the picture?", picture, stream) == (ORDER, reply), stream


def test_a_completion_runs_text_generation_webuis_generate_reply_hooks(served):
    recorder, api = served
    recorder.calls.clear()
    for stream in (False, True):
        result = api.client().completions.create(prompt="Once upon a time", stream=stream, **GREEDY)
        text = "".join(c.choices[0].text for c in result if c.choices) if stream else result.choices[0].text
        assert text.strip()
        assert recorder.calls == COMPLETION_ORDER, stream
        recorder.calls.clear()
