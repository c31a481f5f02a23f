"""Chat: the one chat turn and its state (UI and API alike), prompt building, saving and loading histories.

A history is `{'internal': [[user, bot], ...], 'visible': [[user, bot], ...]}`: `internal` is what
the model sees (images as the tags an extension writes), `visible` what the UI shows (HTML-escaped
text plus those tags). Prompts come from the tokenizer's chat template, with a plain fallback; the
oldest turns are dropped until the prompt fits `get_max_prompt_length(state)`.

`new_state(history, **values)` is the one way a generation `state` is built: the settings, then
what the caller sets (the UI its widgets' values, the API its request's parameters).
`generate_chat_reply(text, state, regenerate, _continue)` is the turn. The UI and the API both call
it, so extensions see text-generation-webui's hooks in its order: history, state, chat_input,
input, custom_generate_chat_prompt, bot_prefix (while the prompt is built), then in `generate_reply`
custom_generate_reply (an extension that offers it generates instead of the host) or tokenizer and
logits_processor, output. Pictures sent with the user message travel in
`state['message_images']`; an extension's `chat_input_modifier` takes them into the text (the
multimodal extension writes image tags). Pictures no extension takes are refused. When the turn
ends, each picture of its user message that the prompt kept gets a caption in the visible text
("N tokens", from the extension's `state['image_tokens']`: `caption_pictures`).
"""
from __future__ import annotations

import copy
import html
import json
import os
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from modules import chat_templates, picture_stand_ins, shared
from modules.extensions import apply_extensions, apply_state_modifiers
from modules.html_generator import IMAGE_CAPTION, IMAGE_CAPTION_RE
from modules.text_generation import generate_reply, get_encoded_length, get_max_prompt_length, stop_requested

HISTORY_DIR = shared.ROOT / "logs" / "chat"
FALLBACK_USER, FALLBACK_BOT = "User:", "Assistant:"
# The pictures sent with the user message being added (file paths, bytes or PIL images, in order).
MESSAGE_IMAGES = "message_images"
# The picture budget of this message or request, for an image extension to read (multimodal: "default",
# "low", "high" or a number of pixels); and what such an extension reports about the turn's prompt: the
# tokens each picture kept takes (prompt order), and the pictures left out to fit the context
# ([{"turn": n, "image": k}], 1-based).
IMAGE_BUDGET = "image_budget"
IMAGE_TOKENS = "image_tokens"
DROPPED_IMAGES = "dropped_images"
DROPPED_TURNS = "dropped_turns"  # how many of the oldest turns the prompt leaves out to fit (none: absent)


class ChatHistoryError(ValueError):
    """A history file that cannot be read or does not hold a chat history."""


class ImagesNotTakenError(ValueError):
    """Pictures came with a message, but no loaded extension takes pictures."""
    code = "images_not_supported"


def new_history() -> dict:
    return {"internal": [], "visible": []}


def new_state(history: dict | None = None, **values: Any) -> dict:
    """A generation `state`, built the one way for the UI, the API and tests: every setting
    (`shared.settings`), then the caller's own `values` (the UI's parameters and per-message inputs, a
    request's overrides), the history (a new one when None) and no notices yet. The two lengths are
    made whole numbers, whichever widget or body gave them; the context is at most a remote engine's
    (it would refuse a longer prompt, where old turns can be left out here)."""
    state = dict(shared.settings)
    state.update(values)
    state["max_new_tokens"] = int(state["max_new_tokens"])
    state["truncation_length"] = int(state["truncation_length"])
    if shared.engine is not None and shared.engine.max_model_len:
        state["truncation_length"] = min(state["truncation_length"], shared.engine.max_model_len)
    state["history"] = new_history() if history is None else history
    state["notices"] = []
    return state


def build_messages(history: list[list[str]], user_input: str | None, state: dict) -> list[dict]:
    messages = []
    if state.get("system_message"):
        messages.append({"role": "system", "content": state["system_message"]})
    for user, bot in history:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": bot})
    if user_input is not None:
        messages.append({"role": "user", "content": user_input})
    return messages


def render_messages(messages: list[dict], state: dict, continue_last: bool = False) -> str:
    """The prompt: the messages, then the bot's prefix (through the `bot_prefix` hook) unless continuing.
    The pictures' tags are set aside while the template renders (`picture_stand_ins`: megabytes each)."""
    pattern = apply_extensions("image_tag_pattern")
    messages, tags = picture_stand_ins.set_aside(messages, pattern)
    if continue_last:
        return picture_stand_ins.put_back(render(messages, continue_last=True), tags, pattern)
    body, prompt = render(messages), render(messages, add_generation_prompt=True)
    if not prompt.startswith(body):  # a template that rewrites earlier text when asked for the prefix
        body = prompt
    bot_prefix = apply_extensions("bot_prefix", prompt[len(body):], state)
    return picture_stand_ins.put_back(body + bot_prefix, tags, pattern)


def render(messages: list[dict], add_generation_prompt: bool = False, continue_last: bool = False) -> str:
    if getattr(shared.tokenizer, "chat_template", None):
        if continue_last:
            return chat_templates.render(messages, continue_final_message=True)
        return chat_templates.render(messages, add_generation_prompt=add_generation_prompt)
    return render_plain(messages, add_generation_prompt)


def render_plain(messages: list[dict], add_generation_prompt: bool) -> str:
    """For tokenizers without a chat template."""
    names = {"user": FALLBACK_USER, "assistant": FALLBACK_BOT}
    lines = [m["content"] if m["role"] == "system" else f"{names[m['role']]} {m['content']}" for m in messages]
    prompt = "\n".join(lines)
    return f"{prompt}\n{FALLBACK_BOT}" if add_generation_prompt else prompt


def generate_chat_prompt(user_input: str, state: dict, **kwargs) -> str:
    """The prompt for `user_input` after `kwargs['history']`, without the fewest oldest turns that make
    it fit, as text-generation-webui drops them one at a time. Each turn dropped shortens the prompt,
    so that number is searched for by halves: a long chat past its context renders a few prompts a
    turn, not one per turn dropped."""
    history = kwargs.get("history", state["history"])["internal"]
    _continue = kwargs.get("_continue", False)
    max_length = get_max_prompt_length(state)
    if max_length <= 0:  # else every turn would be left out, and the message alone cut to nothing
        raise ValueError(f"No room for the prompt: truncation_length ({state['truncation_length']}) - "
                         f"max_new_tokens ({state['max_new_tokens']}) = {max_length} tokens. Lower max_new_tokens.")

    def prompt_without(dropped: int) -> str:
        turns = [list(t) for t in history[dropped:]]
        messages = build_messages(turns, None, state) if _continue else build_messages(turns, user_input, state)
        return render_messages(messages, state, continue_last=_continue)

    # Keep at least the turn being answered; the tokenizer hook truncates what still does not fit.
    most = max(len(history) - (1 if _continue else 0), 0)
    prompt, dropped = prompt_without(0), 0
    if most > 0 and get_encoded_length(prompt) > max_length:
        too_few = 0  # dropping this many does not fit; dropping `most` is the last resort
        prompt, dropped = None, most
        while dropped - too_few > 1:
            middle = (too_few + dropped) // 2
            candidate = prompt_without(middle)
            if get_encoded_length(candidate) <= max_length:
                prompt, dropped = candidate, middle
            else:
                too_few = middle
        prompt = prompt if prompt is not None else prompt_without(dropped)
    tell_dropped_turns(history[:dropped], state, max_length)
    return prompt


def tell_dropped_turns(dropped: list, state: dict, max_length: int) -> None:
    """How many of the oldest turns were left out to fit goes to `state[DROPPED_TURNS]`; the pictures in
    them to `state[DROPPED_IMAGES]` and the notices (a turn's text is left out silently, as
    text-generation-webui does: a long chat would otherwise carry the notice under every reply)."""
    if dropped:
        state[DROPPED_TURNS] = len(dropped)
    pattern = apply_extensions("image_tag_pattern")
    pictures = [{"turn": turn, "image": place} for turn, (user, _) in enumerate(dropped, start=1)
                for place, _ in enumerate(pattern.finditer(user) if pattern else [], start=1)]
    if not pictures:
        return
    state.setdefault(DROPPED_IMAGES, []).extend(pictures)
    turns = sorted({p["turn"] for p in pictures})
    names = f"turn {turns[0]}" if len(turns) == 1 else f"turns {', '.join(map(str, turns[:-1]))} and {turns[-1]}"
    which = "the picture" if len(pictures) == 1 else f"the {len(pictures)} pictures"
    oldest = "The oldest turn was" if len(dropped) == 1 else f"The oldest {len(dropped)} turns were"
    state.setdefault("notices", []).append(
        f"{oldest} left out to fit the context ({max_length} tokens: truncation_length - max_new_tokens), "
        f"with {which} from {names}.")


def get_stopping_strings(state: dict) -> list[str]:
    if getattr(shared.tokenizer, "chat_template", None):
        return []
    return [f"\n{FALLBACK_USER}"]


def user_message(text: str, state: dict) -> tuple[str, str]:
    """A user message as the history keeps it: (internal, visible), through the `chat_input` hooks,
    which take the message's pictures (`state['message_images']`) into the text."""
    text, visible = apply_extensions("chat_input", text, html.escape(text), state)
    if state.get(MESSAGE_IMAGES):
        raise ImagesNotTakenError(
            f"The loaded model ({shared.model_name}) cannot take images: no loaded extension takes the "
            f"{len(state[MESSAGE_IMAGES])} picture(s) sent. Load an image-text model (e.g. a llava-hf folder) "
            f"or start with --multimodal-pipeline NAME.")
    return text, visible


def history_from_turns(turns: list[tuple[str, list, str]], state: dict) -> dict:
    """A history from [(user text, its pictures, bot text), ...] (the API's messages): a user message
    with pictures goes through the `chat_input` hooks as it did when the UI sent it."""
    history = new_history()
    for user, images, bot in turns:
        visible = html.escape(user)
        if images:
            user, visible = user_message(user, {**state, MESSAGE_IMAGES: list(images)})
        history["internal"].append([user, bot])
        history["visible"].append([visible, html.escape(bot)])
    return history


def chatbot_wrapper(text: str, state: dict, regenerate: bool = False, _continue: bool = False,
                    loading_message: bool = True, for_ui: bool = False) -> Iterator[dict]:
    output = start_turn(state)
    if not (regenerate or _continue):
        text, visible_text = user_message(text, state)
        text = apply_extensions("input", text, state, is_chat=True)
        output["internal"].append([text, ""])
        output["visible"].append([visible_text, ""])
    else:
        text, visible_text = output["internal"][-1][0], output["visible"][-1][0]
        if regenerate:
            output["internal"][-1][1] = output["visible"][-1][1] = ""
    if loading_message and not _continue:
        yield {"visible": output["visible"][:-1] + [[visible_text, shared.processing_message]],
               "internal": output["internal"]}
    last_reply = [output["internal"][-1][1], output["visible"][-1][1]] if _continue else ["", ""]
    prompt = chat_prompt(text, state, output, _continue)
    for reply in generate_reply(prompt, state, stopping_strings=get_stopping_strings(state), is_chat=True,
                                for_ui=for_ui):
        reply = reply.lstrip(" ") if not _continue else reply
        output["internal"][-1] = [text, last_reply[0] + reply]
        output["visible"][-1] = [visible_text, last_reply[1] + html.escape(reply)]
        if stop_requested(state):
            break
        if state.get("stream", True):
            yield output
    output["visible"][-1][1] = apply_extensions("output", output["visible"][-1][1], state, is_chat=True)
    output["visible"][-1][1] += notices_html(state.get("notices", []))
    output["visible"][-1][0] = caption_pictures(output["visible"][-1][0], state.get(IMAGE_TOKENS) or [])
    yield output


def start_turn(state: dict) -> dict:
    """The `history` and `state` hooks for a new turn; returns the history the turn writes to."""
    state["notices"] = []  # this turn's: the chat_input hooks and the generation append to it
    for key in (IMAGE_TOKENS, DROPPED_IMAGES, DROPPED_TURNS):  # this turn's prompt's, once it is built
        state.pop(key, None)
    output = apply_extensions("history", copy.deepcopy(state["history"]))
    apply_state_modifiers(state)
    if getattr(shared.tokenizer, "chat_template", None):
        # As text-generation-webui's instruct modes: the template writes the BOS, or the tokenizer adds
        # its own; none is forced (Hugging Face's apply_chat_template gives the same ids).
        state["add_bos_token"] = False
    return output


def chat_prompt(text: str, state: dict, output: dict, _continue: bool) -> str:
    """The prompt: an extension's `custom_generate_chat_prompt`, else the host's own."""
    prompt_history = output if _continue else {k: v[:-1] for k, v in output.items()}
    kwargs = {"_continue": _continue, "history": prompt_history}
    prompt = apply_extensions("custom_generate_chat_prompt", text, state, **kwargs)
    return prompt if prompt is not None else generate_chat_prompt(text, state, **kwargs)


def unfinished_turn(history: dict, message: str) -> dict:
    """`history` as a failed generation left it, its last turn kept with the reply so far and `message`
    under it (visible only), so the user's message and pictures stay for Regenerate."""
    kept = copy.deepcopy(history)
    visible = kept["visible"][-1]
    reply = "" if visible[1] == shared.processing_message else visible[1]
    visible[1] = reply + notices_html([message])
    return kept


def notices_html(notices: list[str]) -> str:
    """Visible-only lines telling the user what happened to their input (e.g. images dropped)."""
    return "".join(f"\n\n⚠ {html.escape(n)}" for n in notices)


def caption_pictures(visible: str, image_tokens: list[int]) -> str:
    """The user message's visible text with each picture's prompt tokens after its tag (visible only:
    `internal`, which the model sees, keeps its tags as they are).

    `image_tokens` is the extension's report of the prompt (`state[IMAGE_TOKENS]`, one entry per picture
    kept, in prompt order): the message's pictures come last, so its last k entries are the message's
    last k pictures. Pictures left out to fit the context (the oldest go first) get no caption. A
    regenerated turn's old captions are replaced.
    """
    visible = IMAGE_CAPTION_RE.sub("", visible)
    pattern = apply_extensions("image_tag_pattern")  # the extension that writes tags
    if pattern is None or not image_tokens:
        return visible
    tags = list(pattern.finditer(visible))
    kept = min(len(tags), len(image_tokens))
    captions = [None] * (len(tags) - kept) + list(image_tokens[len(image_tokens) - kept:])
    pieces, position = [], 0
    for tag, tokens in zip(tags, captions):
        pieces.append(visible[position:tag.end()])
        if tokens is not None:
            pieces.append(IMAGE_CAPTION.format(tokens))
        position = tag.end()
    return "".join(pieces) + visible[position:]


def generate_chat_reply(text: str, state: dict, regenerate: bool = False, _continue: bool = False,
                        loading_message: bool = True, for_ui: bool = False) -> Iterator[dict]:
    """The chat turn (text-generation-webui's semantics): yields the history as the reply grows."""
    history = state["history"]
    if regenerate or _continue:
        text = ""
        if len(history["internal"]) == 0:
            yield history
            return
    yield from chatbot_wrapper(text, state, regenerate=regenerate, _continue=_continue,
                               loading_message=loading_message, for_ui=for_ui)


def remove_last_message(history: dict) -> tuple[str, dict]:
    """Drops the last turn; returns its user text (internal form) and the new history."""
    history = copy.deepcopy(history)
    if not history["internal"]:
        return "", history
    last = history["internal"].pop()
    history["visible"].pop()
    return last[0], history


# -- Saving and loading ---------------------------------------------------------------------

SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def history_path(name: str) -> Path:
    cleaned = SAFE_NAME.sub("_", name).strip("._") or "history"
    return HISTORY_DIR / f"{cleaned}.json"


def new_history_name() -> str:
    return datetime.now().strftime("%Y%m%d-%H-%M-%S")


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: a crash leaves the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_history(history: dict, name: str) -> Path:
    validate_history(history, "history to save")
    path = history_path(name)
    atomic_write_text(path, json.dumps(history, ensure_ascii=False, indent=2))
    return path


def validate_history(history, source: str) -> dict:
    if not isinstance(history, dict) or set(history) < {"internal", "visible"}:
        raise ChatHistoryError(f"{source}: expected a JSON object with 'internal' and 'visible' lists")
    for key in ("internal", "visible"):
        turns = history[key]
        if not isinstance(turns, list) or not all(
                isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in turns):
            raise ChatHistoryError(f"{source}: '{key}' must be a list of [user, bot] string pairs")
    if len(history["internal"]) != len(history["visible"]):
        raise ChatHistoryError(f"{source}: 'internal' has {len(history['internal'])} turns but "
                               f"'visible' has {len(history['visible'])}")
    return {"internal": history["internal"], "visible": history["visible"]}


def parse_history(text: str, source: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ChatHistoryError(f"{source} is not valid JSON ({error}); the file was left as it is") from error
    return validate_history(data, source)


def load_history(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ChatHistoryError(f"Cannot read {path}: {error}") from error
    return parse_history(text, str(path))


def list_saved_histories() -> list[str]:
    if not HISTORY_DIR.exists():
        return []
    return sorted((p.stem for p in HISTORY_DIR.glob("*.json")), reverse=True)
