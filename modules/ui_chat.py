"""The Gradio chat UI: history, textbox, buttons, parameters, save/load, and the extensions block.

Components are registered in `shared.gradio` (text-generation-webui's names: 'textbox',
'Generate', 'Stop', 'history', 'display', ...) so extensions can attach to them in `ui()`.
Each browser session holds its own history in a `gr.State`.

Extensions' UIs: each loaded extension's `ui()` is called below the chat (`create_extensions_block`).
Per-message extension inputs: an extension's `ui()` may register components in
`shared.gradio['extension_inputs']` (state key -> component), e.g. the multimodal extension's
image input as `message_images` (the key the API fills with a message's pictures too, so both
reach extensions the same way). On Generate/Enter the host reads the textbox and those components into
per-session `gr.State`s and clears them (one queue=False step, so clearing never races with the
read), then generates with `state[key]` = the value read. Values are whatever the component's
preprocess returns; an empty value reaches the state as None.
Per-message extension options: components in `shared.gradio['extension_options']` (state key ->
component), e.g. the multimodal extension's picture budget as `image_budget`, are read with every
send and Regenerate into `state[key]`, but are neither cleared nor counted as message content (an
option alone does not send a turn): a choice that stays until the user changes it. Handlers take
their values as PARAMETER_KEYS values, then the extension inputs', then the options' (`split_values`).

The context meter under the chat ("Context: X / Y tokens") is the prompt the next turn starts from:
the history as it stands rendered with an empty message (`chat.generate_chat_prompt`, measured by
`get_encoded_length`, so extensions count their pictures), out of the truncation length. What waits
in the per-message extension inputs goes into that message through the `chat_input` hooks, as a send
puts it there: a picture attached but not yet sent counts at its real cost, which is what a user
wants to know before sending. It is measured after each turn, Regenerate, Remove last, Clear and Load,
and when those two parameters, an extension input or an extension option change.

Errors raised while generating (ValueError for a bad image, too many images, a prompt that cannot
fit, a refusal from a remote engine; anything from a pipeline) become a warning toast plus a notice
line under the chat; the history stays as it was before the message, so the next message works. A
remote engine that is down, too slow or broke off the reply leaves the turn in the history instead,
with whatever of the reply came and the notice, for Regenerate once the engine is back. The Stop
button stops its own session's reply (`session_stop`): with a remote engine, replies run side by side.
A session writes one reply at a time: while one streams, a send (its text stays in the textbox),
Regenerate, Remove last, Clear and Load are refused with the reason (`start_reply`), since the
streaming reply would overwrite what they change.
This module renders no HTML itself (modules/html_generator.py does). Of images it knows only that the
history may hold tags, which it keeps out of the textbox (`strip_image_tags`); extensions handle them.
"""
from __future__ import annotations

import html
import threading
import traceback
import weakref
from typing import Iterator

import gradio as gr

from modules import chat, shared
from modules.extensions import apply_extensions, iterator
from modules.html_generator import CHAT_CSS, chat_html_wrapper, strip_image_tags
from modules.logging_colors import logger
from modules.engine import EngineUnavailableError
from modules.text_generation import get_encoded_length

PARAMETER_KEYS = ["max_new_tokens", "temperature", "top_p", "truncation_length"]


def extension_input_keys() -> list[str]:
    """State keys of the registered per-message extension inputs, in registration order."""
    return list(shared.gradio.get("extension_inputs", {}))


def extension_option_keys() -> list[str]:
    """State keys of the registered per-message extension options, in registration order."""
    return list(shared.gradio.get("extension_options", {}))


def split_values(values: tuple) -> tuple[tuple, tuple, tuple]:
    """A handler's values as (parameters, extension inputs, extension options).

    `values` are the parameter components' values in PARAMETER_KEYS order, optionally followed by one
    value per `extension_input_keys()`, then optionally one per `extension_option_keys()`.
    """
    n_params, inputs, options = len(PARAMETER_KEYS), extension_input_keys(), extension_option_keys()
    if len(values) not in (n_params, n_params + len(inputs), n_params + len(inputs) + len(options)):
        raise ValueError(f"The chat handler got {len(values)} values; expected {n_params} parameters "
                         f"({', '.join(PARAMETER_KEYS)}), then 0 or {len(inputs)} extension inputs "
                         f"({', '.join(inputs)}), then 0 or {len(options)} extension options ({', '.join(options)})")
    n_inputs = min(len(inputs), len(values) - n_params)
    return values[:n_params], values[n_params:n_params + n_inputs], values[n_params + n_inputs:]


def without_inputs(values: tuple) -> tuple:
    """The values of a handler that takes no message inputs (Regenerate): PARAMETER_KEYS
    values, then optionally the options' values, laid out for `split_values` with empty inputs."""
    n_params = len(PARAMETER_KEYS)
    if len(values) == n_params:
        return values
    return (*values[:n_params], *([None] * len(extension_input_keys())), *values[n_params:])


def state_from_values(history: dict, *values) -> dict:
    """`chat.new_state` with a handler's values (`split_values`) under their state keys: the
    parameters', extension inputs' and options'; an option not passed leaves the extension's own
    setting in charge."""
    params, inputs, options = split_values(values)
    keyed = dict(zip(PARAMETER_KEYS, params))
    keyed.update(zip(extension_input_keys(), inputs))
    keyed.update(zip(extension_option_keys(), options))
    return chat.new_state(history, **keyed)


def has_input(text: str, extension_values: tuple) -> bool:
    """Whether a send is a message: text, or a value in a per-message input (options do not count)."""
    return bool(text and text.strip()) or any(bool(v) for v in extension_values)


def generate(text: str, history: dict, *values, regenerate: bool = False,
             stop: threading.Event | None = None) -> Iterator[tuple[str, dict]]:
    """Streams (display html, history) pairs; an error ends it with a notice and the history unchanged,
    except when a remote engine failed: then the turn stays, with what came of the reply, to regenerate
    once the engine is back. `stop`: the session's Stop button (`session_stop`)."""
    if shared.model is None:
        gr.Warning(shared.NO_MODEL_MESSAGE)
        yield chat_html_wrapper(history), history
        return
    if not regenerate and not has_input(text, split_values(values)[1]):
        yield chat_html_wrapper(history), history  # an empty Enter adds no turn
        return
    latest = None
    try:
        state = state_from_values(history, *values)
        state[shared.STOP_EVENT] = stop
        for latest in chat.generate_chat_reply(text, state, regenerate=regenerate, for_ui=True):
            yield chat_html_wrapper(latest), latest
    except Exception as error:  # any failure must reach the user and leave the session usable
        if isinstance(error, ValueError):  # a caller mistake (bad image, prompt too long): no traceback
            logger.warning(f"Generation refused: {error}")
        elif isinstance(error, EngineUnavailableError):
            logger.error(f"Generation failed: {error}")
        else:
            logger.error(f"Generation failed:\n{traceback.format_exc()}")
        message = f"Generation failed: {error}"
        gr.Warning(message)
        if isinstance(error, EngineUnavailableError) and latest is not None:
            kept = chat.unfinished_turn(latest, message)
            yield chat_html_wrapper(kept), kept
        else:
            yield chat_html_wrapper(history, notices=[message]), history


# Each browser session's Stop button stops that session's reply only: with a remote engine, other
# users' replies run at the same time. Held weakly: an event lives as long as its generation.
_session_stops: "weakref.WeakValueDictionary[str, threading.Event]" = weakref.WeakValueDictionary()


def session_stop(request: gr.Request | None) -> threading.Event:
    """A new stop event for the session's next reply."""
    event = threading.Event()
    if request is not None and request.session_hash:
        _session_stops[request.session_hash] = event
    return event


def stop_session(request: gr.Request) -> None:
    """The Stop button: ends this session's reply being generated (the stop reaches it between tokens)."""
    event = _session_stops.get(request.session_hash) if request is not None else None
    if event is not None:
        event.set()


# Sessions with a reply being written. Each event gets the session's history as it was when the event
# started and overwrites it with every update, so a second send, Regenerate, Remove last, Clear or Load
# while a reply streams would be undone by that reply, or would lose it. They are refused instead
# (`gr.Error`, shown as a toast by a queued event only); a refused send stops before the step that
# clears the textbox, so nothing typed is lost.
REPLY_PENDING = "A reply is still being written: wait for it, or press Stop, then try again."
_writing: set[str] = set()
_writing_lock = threading.Lock()


def reply_pending() -> gr.Error:
    return gr.Error(REPLY_PENDING, title="Reply in progress", print_exception=False)  # a user's click, not a fault


def session_key(request: gr.Request | None) -> str | None:
    return request.session_hash if request is not None and request.session_hash else None


def start_reply(request: gr.Request) -> None:
    """Marks the session's reply as being written; refuses when one already is. (Gradio passes the
    request to a parameter annotated `gr.Request`; None outside one.)"""
    key = session_key(request)
    if key is None:
        return
    with _writing_lock:
        if key in _writing:
            raise reply_pending()
        _writing.add(key)


def end_reply(request: gr.Request | None) -> None:
    _writing.discard(session_key(request))


def refuse_while_writing(request: gr.Request | None) -> None:
    """For the buttons that change the history without writing a reply."""
    if session_key(request) in _writing:
        raise reply_pending()


def send(request: gr.Request, text: str, history: dict, *values) -> Iterator[tuple[str, dict]]:
    """Generate and Enter, as wired: `generate` with the session's stop. The send's last step
    (`restore_unsent`) ends the reply; where the page went away and that step never comes, this does."""
    finished = False
    try:
        yield from generate(text, history, *values, stop=session_stop(request))
        finished = True
    finally:
        if not finished:
            end_reply(request)


def regenerate_in_session(request: gr.Request, history: dict, *values) -> Iterator[tuple[str, dict]]:
    """Regenerate, as wired: `regenerate` with the session's stop, one reply at a time."""
    start_reply(request)
    try:
        yield from regenerate(history, *values, stop=session_stop(request))
    finally:
        end_reply(request)


def regenerate(history: dict, *values, stop: threading.Event | None = None) -> Iterator[tuple[str, dict]]:
    """`values`: PARAMETER_KEYS values, then optionally the extension options' (no message inputs)."""
    yield from generate("", history, *without_inputs(values), regenerate=True, stop=stop)


def context_meter(history: dict, *values) -> str:
    """"Context: X / Y tokens": the prompt the next turn starts from, with what waits in the extension
    inputs, out of the truncation length. `values` as `split_values`'. Empty while no model is loaded."""
    if shared.model is None:
        return ""
    state = state_from_values(history, *values)
    try:
        used = get_encoded_length(chat.generate_chat_prompt(pending_message(state), state))
    except ValueError as error:  # e.g. a loaded history, or a picture waiting, that cannot be read
        logger.warning(f"The context meter cannot measure the next prompt: {error}")
        return html.escape(f"Context: cannot be measured ({error}) / {state['truncation_length']} tokens")
    return f"Context: {used} / {state['truncation_length']} tokens"


def pending_message(state: dict) -> str:
    """The next message as far as it is known before it is sent: no text, and what waits in the extension
    inputs (`state`'s) written in by the `chat_input` hooks (the multimodal extension's pictures as its
    tags). The hooks run only when something waits: with nothing, they would take a picture meant for
    the next send from a host-wide hand-over such as text-generation-webui's `input_hijack`."""
    if not any(state.get(key) for key in extension_input_keys()):
        return ""
    return chat.user_message("", state)[0]


def take_inputs(text: str, history: dict, *extension_values) -> tuple:
    """A send's step after `start_reply`: (text, turns so far, *values) into pending states, then clear
    the inputs."""
    pending = tuple(v if v else None for v in extension_values)
    return (text, len(history["internal"]), *pending, "", *([None] * len(extension_values)))


def restore_unsent(request: gr.Request, text: str, history: dict, turns_before: int, *pending_then_current) -> tuple:
    """Last step of a send, which ends the session's reply. A message that did not become a turn (its
    generation failed, a picture could not be read) goes back: its words to the textbox, and each
    extension input's value (its pictures) to that input unless something new was put there meanwhile.
    Nothing sent is lost; the notice says what to change."""
    end_reply(request)
    count = len(pending_then_current) // 2
    pending, current = pending_then_current[:count], pending_then_current[count:]
    if len(history["internal"]) > turns_before:
        values = (gr.update(),) * (1 + count)
    else:
        values = (strip_image_tags(text), *(value if value and not now else gr.update()
                                            for value, now in zip(pending, current)))
    return values if count else values[0]  # Gradio takes one output's value bare


def remove_last(request: gr.Request, history: dict) -> tuple[str, dict, str]:
    refuse_while_writing(request)
    text, history = chat.remove_last_message(history)
    # The user's words go back to the textbox; its images (kilobytes of base64) do not.
    return chat_html_wrapper(history), history, strip_image_tags(text)


def clear_history(request: gr.Request) -> tuple[str, dict]:
    refuse_while_writing(request)
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


def load(request: gr.Request, history: dict, name: str) -> tuple[str, dict]:
    refuse_while_writing(request)
    if not name:
        return chat_html_wrapper(history), history
    try:
        loaded = chat.load_history(chat.history_path(name))
    except chat.ChatHistoryError as error:
        gr.Warning(str(error))
        return chat_html_wrapper(history, notices=[str(error)]), history
    return chat_html_wrapper(loaded), loaded


def create_chat_tab() -> None:
    g = shared.gradio
    g["history"] = gr.State(chat.new_history())
    g["display"] = gr.HTML(chat_html_wrapper(chat.new_history()), elem_id="chat-display", autoscroll=True)
    g["context_meter"] = gr.HTML(context_meter(chat.new_history(), *(shared.settings[k] for k in PARAMETER_KEYS)),
                                 elem_id="context-meter", padding=False)
    with gr.Row():
        g["textbox"] = gr.Textbox(label="Input", placeholder="Send a message (Enter sends, Shift+Enter adds a line)",
                                  lines=1, max_lines=12, scale=8, elem_id="chat-input")
        with gr.Column(scale=1, min_width=120):
            g["Generate"] = gr.Button("Generate", variant="primary", elem_id="Generate")
            g["Stop"] = gr.Button("Stop", elem_id="stop")
    with gr.Row():
        g["Regenerate"] = gr.Button("Regenerate", size="sm", elem_id="Regenerate")
        g["Remove last"] = gr.Button("Remove last", size="sm", elem_id="Remove-last")
        g["Clear history"] = gr.Button("Clear", size="sm", elem_id="Clear-history")
    create_parameters()
    create_extensions_block()
    create_save_load()


def create_extensions_block() -> None:
    """Calls each loaded extension's `ui()` inside the current Gradio context, below the chat."""
    to_display = [(ext, name) for ext, name in iterator()
                  if hasattr(ext, "ui") and not getattr(ext, "params", {}).get("is_tab", False)]
    if not to_display:
        return
    with gr.Column(elem_id="extensions"):
        for extension, name in to_display:
            try:
                extension.ui()
            except Exception:  # one extension's broken UI must not take the chat down
                logger.error(f'The UI of extension "{name}" failed:\n{traceback.format_exc()}')


def create_parameters() -> None:
    g = shared.gradio
    s = shared.settings
    with gr.Accordion("Parameters", open=False):
        g["max_new_tokens"] = gr.Slider(1, 4096, value=s["max_new_tokens"], step=1, label="max_new_tokens")
        g["temperature"] = gr.Slider(0.0, 2.0, value=s["temperature"], step=0.01, label="temperature")
        g["top_p"] = gr.Slider(0.0, 1.0, value=s["top_p"], step=0.01, label="top_p")
        g["truncation_length"] = gr.Slider(64, context_limit(), value=s["truncation_length"], step=64,
                                           label="truncation_length")


def context_limit() -> int:
    """The truncation_length slider's end: a remote engine's context (no longer prompt is taken), else
    32768 or the setting where that is more."""
    engine_length = shared.engine.max_model_len if shared.engine is not None else None
    return max(64, engine_length) if engine_length else max(32768, shared.settings["truncation_length"])


def create_save_load() -> None:
    g = shared.gradio
    with gr.Accordion("Save / load history", open=False):
        with gr.Row():
            g["save_name"] = gr.Textbox(label="Name", placeholder="leave empty for a timestamp")
            g["Save history"] = gr.Button("Save", elem_id="Save-history")
        with gr.Row():
            g["saved_histories"] = gr.Dropdown(chat.list_saved_histories(), label="Saved histories",
                                               allow_custom_value=False, elem_id="saved-histories")
            g["Load history"] = gr.Button("Load", elem_id="Load-history")


def wire_send(params: list, options: list) -> None:
    """Generate and Enter: claim the session's reply (`start_reply`), read + clear the inputs (queue=False),
    stream the reply, give back what did not become a turn (which ends the reply), then measure the context."""
    g = shared.gradio
    ext_inputs = [g["extension_inputs"][key] for key in extension_input_keys()]
    g["last_input"] = gr.State("")
    turns_before = gr.State(0)
    pending = [gr.State(None) for _ in ext_inputs]
    for trigger in (g["Generate"].click, g["textbox"].submit):
        trigger(start_reply, None, None, show_progress="hidden").success(  # refused: the textbox keeps it
            take_inputs, [g["textbox"], g["history"], *ext_inputs],
            [g["last_input"], turns_before, *pending, g["textbox"], *ext_inputs],
            queue=False, show_progress="hidden").then(
            send, [g["last_input"], g["history"], *params, *pending, *options], [g["display"], g["history"]],
            show_progress="hidden").then(
            restore_unsent, [g["last_input"], g["history"], turns_before, *pending, *ext_inputs],
            [g["textbox"], *ext_inputs], queue=False, show_progress="hidden").then(
            context_meter, [g["history"], *params, *ext_inputs, *options], g["context_meter"], show_progress="hidden")


def wire_events() -> None:
    g = shared.gradio
    params = [g[k] for k in PARAMETER_KEYS]
    options = [g["extension_options"][key] for key in extension_option_keys()]
    display_and_history = [g["display"], g["history"]]
    wire_send(params, options)
    ext_inputs = [g["extension_inputs"][key] for key in extension_input_keys()]
    measure = {"fn": context_meter, "inputs": [g["history"], *params, *ext_inputs, *options],
               "outputs": g["context_meter"], "show_progress": "hidden"}
    g["Regenerate"].click(regenerate_in_session, [g["history"], *params, *options], display_and_history,
                          show_progress="hidden").then(**measure)
    g["Stop"].click(stop_session, None, None, queue=False)
    g["Remove last"].click(remove_last, g["history"], [*display_and_history, g["textbox"]]).then(**measure)
    g["Clear history"].click(clear_history, None, display_and_history).then(**measure)
    g["Save history"].click(save, [g["history"], g["save_name"]], g["saved_histories"])
    g["Load history"].click(load, [g["history"], g["saved_histories"]], display_and_history).then(**measure)
    for name in ("max_new_tokens", "truncation_length"):  # both decide what the next prompt keeps
        g[name].change(trigger_mode="always_last", **measure)
    # A picture attached, removed or given another budget. `change` is every component's event; it also
    # fires when a send clears the inputs, measuring the history alone until the turn's own measure.
    for component in (*ext_inputs, *options):
        component.change(trigger_mode="always_last", **measure)


def create_interface() -> gr.Blocks:
    """Builds the Blocks (the extensions' `ui()` included) and registers components in shared.gradio."""
    shared.gradio.clear()
    shared.gradio["extension_inputs"] = {}
    shared.gradio["extension_options"] = {}
    title = f"Chat · {shared.model_name}"
    with gr.Blocks(title=title, analytics_enabled=False) as interface:
        shared.gradio["interface"] = interface
        gr.Markdown(f"### {gr_escape(title)}")
        with gr.Tab("Chat"):
            create_chat_tab()
        wire_events()
    return interface


def gr_escape(text: str) -> str:
    """Model folder names are user data: keep Markdown/HTML in them from rendering."""
    return html.escape(text).replace("*", "\\*").replace("_", "\\_")


def interface_css() -> str:
    return CHAT_CSS + apply_extensions("css")


def interface_js() -> str | None:
    js = apply_extensions("js")
    return js or None
