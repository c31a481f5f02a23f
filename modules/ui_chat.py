"""The Gradio chat UI: history, textbox, buttons, parameters, save/load, and the extensions block.

Components are registered in `shared.gradio` (text-generation-webui's names: 'textbox',
'Generate', 'Stop', 'history', 'display', ...) so extensions can attach to them in `ui()`.
Each browser session holds its own history in a `gr.State`.
"""
from __future__ import annotations

import traceback

import gradio as gr

from modules import chat, shared
from modules.extensions import apply_extensions, create_extensions_block
from modules.html_generator import CHAT_CSS, chat_html_wrapper
from modules.logging_colors import logger
from modules.text_generation import stop_everything_event

PARAMETER_KEYS = ["max_new_tokens", "temperature", "top_p", "truncation_length"]


def build_state(history: dict, *values) -> dict:
    state = dict(shared.settings)
    state.update(zip(PARAMETER_KEYS, values))
    state["max_new_tokens"] = int(state["max_new_tokens"])
    state["truncation_length"] = int(state["truncation_length"])
    state["history"] = history
    return state


def generate(text: str, history: dict, *values, regenerate: bool = False):
    """Streams (display html, history) pairs; errors end up as a notice, never losing the history."""
    if shared.model is None:
        gr.Warning("No model is loaded: start the server with --model NAME (see models/README.md).")
        yield chat_html_wrapper(history), history
        return
    state = build_state(history, *values)
    latest = history
    try:
        for latest in chat.generate_chat_reply(text, state, regenerate=regenerate, for_ui=True):
            yield chat_html_wrapper(latest), latest
    except Exception as error:
        logger.error(f"Generation failed:\n{traceback.format_exc()}")
        gr.Warning(f"Generation failed: {error}")
        keep = history if latest is None or not latest.get("internal") else latest
        yield chat_html_wrapper(keep), keep


def regenerate(history: dict, *values):
    yield from generate("", history, *values, regenerate=True)


def remove_last(history: dict):
    text, history = chat.remove_last_message(history)
    return chat_html_wrapper(history), history, text


def clear_history():
    history = chat.new_history()
    return chat_html_wrapper(history), history


def save(history: dict, name: str):
    try:
        path = chat.save_history(history, name or chat.new_history_name())
    except (OSError, chat.ChatHistoryError) as error:
        gr.Warning(f"Could not save the history: {error}")
        return gr.update()
    gr.Info(f"Saved {path.name}")
    return gr.update(choices=chat.list_saved_histories(), value=path.stem)


def load(history: dict, name: str):
    if not name:
        return chat_html_wrapper(history), history
    try:
        loaded = chat.load_history(chat.history_path(name))
    except chat.ChatHistoryError as error:
        gr.Warning(str(error))
        return chat_html_wrapper(history), history
    return chat_html_wrapper(loaded), loaded


def create_chat_tab() -> None:
    g = shared.gradio
    g["history"] = gr.State(chat.new_history())
    g["display"] = gr.HTML(chat_html_wrapper(chat.new_history()), elem_id="chat-display")
    with gr.Row():
        g["textbox"] = gr.Textbox(label="Input", placeholder="Send a message", lines=2, scale=8,
                                  elem_id="chat-input")
        with gr.Column(scale=1, min_width=120):
            g["Generate"] = gr.Button("Generate", variant="primary", elem_id="Generate")
            g["Stop"] = gr.Button("Stop", elem_id="stop")
    with gr.Row():
        g["Regenerate"] = gr.Button("Regenerate", size="sm")
        g["Remove last"] = gr.Button("Remove last", size="sm")
        g["Clear history"] = gr.Button("Clear", size="sm")
    create_parameters()
    create_extensions_block()
    create_save_load()


def create_parameters() -> None:
    g = shared.gradio
    s = shared.settings
    with gr.Accordion("Parameters", open=False):
        g["max_new_tokens"] = gr.Slider(1, 4096, value=s["max_new_tokens"], step=1, label="max_new_tokens")
        g["temperature"] = gr.Slider(0.0, 2.0, value=s["temperature"], step=0.01, label="temperature")
        g["top_p"] = gr.Slider(0.0, 1.0, value=s["top_p"], step=0.01, label="top_p")
        g["truncation_length"] = gr.Slider(64, max(32768, s["truncation_length"]), value=s["truncation_length"],
                                           step=64, label="truncation_length")


def create_save_load() -> None:
    g = shared.gradio
    with gr.Accordion("Save / load history", open=False):
        with gr.Row():
            g["save_name"] = gr.Textbox(label="Name", placeholder="leave empty for a timestamp")
            g["Save history"] = gr.Button("Save")
        with gr.Row():
            g["saved_histories"] = gr.Dropdown(chat.list_saved_histories(), label="Saved histories",
                                               allow_custom_value=False)
            g["Load history"] = gr.Button("Load")


def wire_events() -> None:
    g = shared.gradio
    params = [g[k] for k in PARAMETER_KEYS]
    display_and_history = [g["display"], g["history"]]
    g["last_input"] = gr.State("")
    for trigger in (g["Generate"].click, g["textbox"].submit):
        trigger(lambda text: (text, ""), g["textbox"], [g["last_input"], g["textbox"]], queue=False).then(
            generate, [g["last_input"], g["history"], *params], display_and_history)
    g["Regenerate"].click(regenerate, [g["history"], *params], display_and_history)
    g["Stop"].click(stop_everything_event, None, None, queue=False)
    g["Remove last"].click(remove_last, g["history"], [*display_and_history, g["textbox"]])
    g["Clear history"].click(clear_history, None, display_and_history)
    g["Save history"].click(save, [g["history"], g["save_name"]], g["saved_histories"])
    g["Load history"].click(load, [g["history"], g["saved_histories"]], display_and_history)


def create_interface() -> gr.Blocks:
    title = f"Chat · {shared.model_name}"
    with gr.Blocks(title=title, analytics_enabled=False) as interface:
        shared.gradio["interface"] = interface
        gr.Markdown(f"### {title}")
        with gr.Tab("Chat"):
            create_chat_tab()
        wire_events()
    return interface


def interface_css() -> str:
    return CHAT_CSS + apply_extensions("css")


def interface_js() -> str | None:
    js = apply_extensions("js")
    return js or None
