"""An example extension documenting every hook, in the order the host calls them.

Copy this folder to `extensions/NAME/` and keep only the hooks you need. Every hook is optional.
Names and signatures are text-generation-webui's, so an extension runs in either host.

Start-up (`modules.extensions.load_extensions`):
  1. the module is imported;
  2. `params` is updated from settings keys `example-<key>` (e.g. `example-prefix: ">> "`);
  3. `setup()` is called once;
  then the host constructs the classes in `logits_processors` (batch-level logits processors,
  `modules/logits_processors.py`; an example is `examples/target_token.py`) with every other
  loaded processor. text-generation-webui ignores that list: use hook 10 there.
Building the UI (`modules.ui_chat`): `custom_css()`, `custom_js()`, then `ui()` below the chat.
  This host only (feature-detect the keys in `shared.gradio`): a component registered in
  `shared.gradio['extension_inputs'][KEY]` is per-message content, read on send into `state[KEY]`
  and cleared; one in `shared.gradio['extension_options'][KEY]` is a per-message option, read on
  every send and Regenerate into `state[KEY]`, kept, and never counted as content.
Each chat turn (`modules.chat.generate_chat_reply`, the same for the UI and `/v1/chat/completions`):
  4. `history_modifier(history)`, `state_modifier(state)`;
  5. `chat_input_modifier(text, visible_text, state)` -> (text for the model, text for the UI);
     pictures sent with the message are in `state['message_images']` (UI uploads, API image parts):
     an extension that uses them pops the key (pictures nobody takes are refused). This host's
     context meter calls it too while per-message inputs hold something (no text, those inputs in
     `state`), and no turn follows: keep it free of side effects beyond `state`;
  6. `input_modifier(string, state, is_chat)`;
  7. `custom_generate_chat_prompt(user_input, state, **kwargs)` -> a prompt, or leave it undefined;
     otherwise the host builds it and calls `bot_prefix_modifier(string, state)` on the start of the
     bot's turn; prompt building calls `custom_tokenized_length(prompt)` (through
     `get_encoded_length`) to measure;
  8. `custom_generate_reply(question, original_question, state, stopping_strings, is_chat=...)`:
     the first extension that has this attribute generates instead of the host (looked up with
     hasattr on every reply, so a module-level `__getattr__` may offer it only sometimes). It yields
     the cumulative reply; the host cuts each at the stopping strings, ends at the stop button, and
     passes the last one to step 11. To add to the host's own generation, call
     `modules.text_generation.generate_reply_HF` with the same arguments (not `generate_reply`: the
     generation lock is already held). Steps 9-10 run only in the host's own generation;
  9. `tokenizer_modifier(state, prompt, input_ids, input_embeds)` -> (prompt, input_ids, input_embeds):
     return `input_embeds` [1, n, hidden] to make the model generate from embeddings;
 10. `logits_processor_modifier(processor_list, input_ids)` -> append LogitsProcessors;
 11. `output_modifier(string, state, is_chat)` on the finished reply.
Asked whenever the host measures a prompt: `custom_tokenized_length(prompt)` -> its length in
tokens, or None to let the host count.
This host only: `image_tag_pattern()` -> a compiled regex with groups `mime` and `data` for the
image tags the extension writes into messages; the chat renders each match as a picture.
`image_placeholder()` -> the text the model's chat template writes for an image part (or None); the
host renders structured chat messages with each image tag there.
This host with a remote engine (`--engine-url`) only: steps 9-10 do not run; instead
`engine_prompt(prompt, state)` -> None, or `{"pieces", "images", "placeholder", "processor_kwargs"}`:
the prompt's text around its pictures, the pictures as data URLs, the text the engine's processor
expands for each, and that processor's keyword arguments (modules/remote_generation.py).
"""
from __future__ import annotations

params = {
    "display_name": "Example",
    "is_tab": False,
}

# Subclasses of modules.logits_processors.LogitsProcessor, constructed once after setup().
logits_processors: list = []


def setup() -> None:
    """Once, after `params` were updated from settings. Load models or files here, not at import."""


def ui() -> None:
    """Build Gradio components; `modules.shared.gradio` holds the host's ('textbox', 'Generate', ...)."""


def custom_css() -> str:
    return ""


def custom_js() -> str:
    return ""


def history_modifier(history: dict) -> dict:
    """The chat history ({'internal': [...], 'visible': [...]}) before the turn is built."""
    return history


def state_modifier(state: dict) -> dict:
    """The generation settings for this turn."""
    return state


def chat_input_modifier(text: str, visible_text: str, state: dict) -> tuple[str, str]:
    """The user's message: what the model sees, and what the chat shows (HTML-escaped)."""
    return text, visible_text


def input_modifier(string: str, state: dict, is_chat: bool = False) -> str:
    """The user's text (chat) or the whole prompt (plain generation)."""
    return string


def custom_tokenized_length(prompt: str) -> int:
    """Return the prompt's length in tokens when it differs from plain tokenizing (e.g. images)."""
    raise NotImplementedError  # left undefined in real extensions that do not need it


del custom_tokenized_length  # defining it would replace the host's own length for every prompt


def bot_prefix_modifier(string: str, state: dict) -> str:
    """The text that starts the bot's turn in the prompt (e.g. 'ASSISTANT:'), while the prompt is built."""
    return string


def custom_generate_reply(question: str, original_question: str, state: dict, stopping_strings: list,
                          is_chat: bool = False):
    """Yield the cumulative reply to `question` (the prompt; `original_question` is it before
    `input_modifier` in plain generation). `stopping_strings` are the caller's; the host applies
    them and `state['custom_stopping_strings']` to what you yield."""
    raise NotImplementedError


del custom_generate_reply  # defining it would replace the host's generation for every reply


def tokenizer_modifier(state: dict, prompt: str, input_ids, input_embeds):
    """The encoded prompt right before generation."""
    return prompt, input_ids, input_embeds


def logits_processor_modifier(processor_list: list, input_ids) -> list:
    return processor_list


def output_modifier(string: str, state: dict, is_chat: bool = False) -> str:
    """The model's reply (chat: the visible, HTML-escaped reply)."""
    return string
