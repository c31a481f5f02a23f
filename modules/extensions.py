"""Loading extensions and calling their hooks, with text-generation-webui's names and semantics.

An extension is `extensions/NAME/script.py`. `load_extensions()` imports each name in the
`default_extensions` setting, then in `shared.args.extensions`, applies `NAME-param` settings to
its `params`, and calls `setup()`.
An extension that raises while loading is logged with its traceback and skipped.
`apply_extensions(typ, ...)` runs one kind of hook over the loaded extensions in load order;
`extensions/example/script.py` documents every hook in call order, this host's own two included.
"""
from __future__ import annotations

import importlib
import traceback
from functools import partial
from inspect import signature
from pathlib import Path
from typing import Any, Iterator

from modules import shared
from modules.logging_colors import logger

# name -> [enabled, load index]
state: dict[str, list] = {}
setup_called: set = set()
available_extensions: list[str] = []


def list_available_extensions() -> list[str]:
    """Folders holding a script.py on the `extensions` package path (tests may add folders to it)."""
    import extensions

    folders = [Path(p) for p in extensions.__path__]
    return sorted({p.name for folder in folders if folder.is_dir() for p in folder.iterdir() if (p / "script.py").exists()})


def apply_settings(extension, name: str) -> None:
    """`NAME-param` keys in `shared.settings` override `extension.params['param']`."""
    params = getattr(extension, "params", None)
    if not isinstance(params, dict):
        return
    for param in params:
        key = f"{name}-{param}"
        shared.default_settings.setdefault(key, params[param])
        if key in shared.settings:
            params[param] = shared.settings[key]


def load_extension(name: str, index: int) -> bool:
    logger.info(f'Loading the extension "{name}"')
    try:
        extension = importlib.import_module(f"extensions.{name}.script")
        apply_settings(extension, name)
        if extension not in setup_called and hasattr(extension, "setup"):
            setup_called.add(extension)
            extension.setup()
    except Exception:
        logger.error(f'Failed to load the extension "{name}":\n{traceback.format_exc()}')
        return False
    state[name] = [True, index]
    return True


def load_extensions() -> None:
    global available_extensions
    available_extensions = list_available_extensions()
    names = list(dict.fromkeys(list(shared.settings.get("default_extensions") or []) + list(shared.args.extensions)))
    for index, name in enumerate(names):
        if name in state:
            continue
        if name not in available_extensions:
            logger.error(f'Extension "{name}" not found in extensions/. Available: {", ".join(available_extensions)}')
            continue
        load_extension(name, index)


def iterator() -> Iterator[tuple[Any, str]]:
    for name in sorted(state, key=lambda x: state[x][1]):
        if state[name][0]:
            yield importlib.import_module(f"extensions.{name}.script"), name


def _apply_string_extensions(function_name: str, text: str, state: dict, is_chat: bool = False) -> str:
    for extension, _ in iterator():
        func = getattr(extension, function_name, None)
        if func is None:
            continue
        # Older extensions take (text) only; newer ones (text, state) and maybe is_chat.
        names = list(signature(func).parameters)
        args = [text, state] if len([n for n in names if n != "is_chat"]) == 2 else [text]
        kwargs = {"is_chat": is_chat} if "is_chat" in names else {}
        text = func(*args, **kwargs)
    return text


def _apply_chat_input_extensions(text: str, visible_text: str, state: dict) -> tuple[str, str]:
    for extension, _ in iterator():
        if hasattr(extension, "chat_input_modifier"):
            text, visible_text = extension.chat_input_modifier(text, visible_text, state)
    return text, visible_text


def _apply_one_arg_extensions(function_name: str, value):
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            value = getattr(extension, function_name)(value)
    return value


def apply_state_modifiers(state: dict) -> None:
    """The `state` hooks, on `state` itself: callers read generation_stats and notices from the dict they
    passed, and an extension may return another."""
    returned = apply_extensions("state", state)
    if returned is not state:
        state.update(returned)


def _apply_tokenizer_extensions(function_name: str, state: dict, prompt, input_ids, input_embeds):
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            prompt, input_ids, input_embeds = getattr(extension, function_name)(state, prompt, input_ids, input_embeds)
    return prompt, input_ids, input_embeds


def _apply_logits_processor_extensions(function_name: str, processor_list, input_ids):
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            result = getattr(extension, function_name)(processor_list, input_ids)
            if isinstance(result, list):
                processor_list = result
    return processor_list


def _apply_first(function_name: str, *args, **kwargs):
    """The first extension defining `function_name` decides; None when none does."""
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            return getattr(extension, function_name)(*args, **kwargs)
    return None


def _first_function(function_name: str):
    """The first extension's `function_name` itself, not called; None when none has it. Looked up
    with hasattr each time: a module-level `__getattr__` may offer or withdraw it at run time."""
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            return getattr(extension, function_name)
    return None


def _apply_custom_css_or_js(function_name: str) -> str:
    return "".join(getattr(ext, function_name)() for ext, _ in iterator() if hasattr(ext, function_name))


EXTENSION_MAP = {
    "input": partial(_apply_string_extensions, "input_modifier"),
    "output": partial(_apply_string_extensions, "output_modifier"),
    "bot_prefix": partial(_apply_string_extensions, "bot_prefix_modifier"),
    "chat_input": _apply_chat_input_extensions,
    "state": partial(_apply_one_arg_extensions, "state_modifier"),
    "history": partial(_apply_one_arg_extensions, "history_modifier"),
    "tokenizer": partial(_apply_tokenizer_extensions, "tokenizer_modifier"),
    "logits_processor": partial(_apply_logits_processor_extensions, "logits_processor_modifier"),
    "custom_generate_chat_prompt": partial(_apply_first, "custom_generate_chat_prompt"),
    # The function is returned, as text-generation-webui does; `text_generation._generate_reply` calls it.
    "custom_generate_reply": partial(_first_function, "custom_generate_reply"),
    "tokenized_length": partial(_apply_first, "custom_tokenized_length"),
    # This host's only: the regex (named groups `mime`, `data`) of the image tags an extension writes
    # into visible text, which the chat renders as pictures. text-generation-webui renders HTML as is.
    "image_tag_pattern": partial(_apply_first, "image_tag_pattern"),
    # ...and the text the model's chat template writes for an image part, where each tag goes when the
    # host renders structured messages (modules/chat_templates.py).
    "image_placeholder": partial(_apply_first, "image_placeholder"),
    # ...and, with a remote engine (modules/remote_generation.py), a prompt's pictures as the engine takes them.
    "engine_prompt": partial(_apply_first, "engine_prompt"),
    "css": partial(_apply_custom_css_or_js, "custom_css"),
    "js": partial(_apply_custom_css_or_js, "custom_js"),
}


def apply_extensions(typ: str, *args, **kwargs):
    if typ not in EXTENSION_MAP:
        raise ValueError(f"Unknown extension hook type '{typ}'. Known: {', '.join(EXTENSION_MAP)}")
    return EXTENSION_MAP[typ](*args, **kwargs)


def reset() -> None:
    """Forget loaded extensions (tests load different sets in one process)."""
    state.clear()
    setup_called.clear()
