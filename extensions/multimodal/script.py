"""The multimodal extension: lets a local vision-language model see the images in a chat.

It runs unchanged in this repository's host and in text-generation-webui, old (the versions that
shipped the original extension) and current (whose Transformers loader has no vision), from
`extensions/multimodal/` or, in the current one, `user_data/extensions/multimodal/`. Of the host it
uses only names every one of them has (`modules.shared`, `modules.text_generation.encode` /
`get_max_prompt_length`, `modules.logging_colors.logger`), and, where the extension generates for an
image-text checkpoint (today's text-generation-webui, on the fast path and the processor route
alike: tgw/generation.py), `modules.text_generation.generate_reply_HF`; anything more is
feature-detected.

This file is the hook table: each hook hands its work to the module that holds it. The folders say
which host a module serves: `core/` both (what a picture becomes), `tgw/` text-generation-webui (this
file imports it in every host; in this repository's host its calls find nothing to do),
`lean_host/` this repository's host only; `pipelines/` the vision parts (`hf_auto/`: today's
transformers checkpoints; `llava/`: the original LLaVA releases); `abstract_pipeline.py` the
contract third-party pipelines implement. docs/ARCHITECTURE.md maps them.

Hooks, in the order the host calls them:
- `setup()`: where the host is text-generation-webui, lets its `AutoModelForCausalLM` load image-text
  checkpoints as their full class (a pipeline module's `register_auto_classes`) and its template
  environment render `{% generation %}` (`tgw/template_tags.py`) and messages as parts
  (`tgw/template_parts.py`); then loads the pipeline (`--multimodal-pipeline`, else the
  `multimodal-pipeline` setting, else recognised from the model); raises a RuntimeError listing the
  available pipelines when a model is loaded and none fits. With no model loaded yet (a host started
  without one) the pipeline is picked when a model is; it is picked again whenever the model changes.
  Runs without a UI.
- `ui()`: the image input (extensions/multimodal/core/ui.py), built inside the host's Gradio layout.
- `state_modifier(state)`: refuses a message's or request's picture budget that is none of those
  accepted, with or without a picture (core/image_budget.py); with a remote engine in
  text-generation-webui, makes its `truncation_length` at most the engine's context
  (tgw/remote_generation.py).
- `chat_input_modifier(text, visible_text, state)`: puts the images sent with this message
  (`state['message_images']`, from this repository's UI and API, or `input_hijack`) into the text
  as `<img>` tags: each `<image>` in the text takes the next one, the rest go before the text.
- `custom_tokenized_length(prompt)`: prompt length in tokens, image tokens included (on the processor
  route None for a prompt without pictures: the host measures text itself).
- `custom_generate_reply(question, original_question, ...)`: present only while the loaded model is
  an image-text checkpoint in a host that builds `generate()`'s inputs itself (text-generation-webui):
  the host's own generation, with the inputs of its `generate()` call set by the extension: the fast
  path's route and kept KV cache, or the processor's image tensors (extensions/multimodal/tgw/generation.py).
- `tokenizer_modifier(state, prompt, input_ids, input_embeds)`: for a prompt with images (`<img>`
  tags, or text-generation-webui's `<__media__>` markers with the pictures in `state`),
  `(prompt, input_ids [1, n] int64, inputs_embeds [1, n, hidden])` on the model's device and dtype;
  on the processor route `(prompt, the processor's input_ids, None)`, its other tensors left in
  `state[PROCESSOR_INPUTS]`; other prompts come back unchanged.
- `logits_processor_modifier(processor_list, input_ids)`: in hosts without batch-level logits
  processors (text-generation-webui), adds the ban on image placeholder tokens
  (extensions/multimodal/core/placeholder_ban.py). This repository's host constructs the batch-level
  `logits_processors` after `setup()` instead, and this hook adds nothing.
- `engine_prompt(prompt, state)` (this repository's host with `--engine-url` only): instead of the
  tokenizer hook, the prompt as a remote engine takes it: its text around the pictures, the pictures'
  bytes as data URLs, and what each picture costs (core/engine_prompt.py).
- `image_tag_pattern()`, `image_placeholder()` (this repository's host only): the tag's regex, so its chat
  renders the pictures; the text the chat template writes for an image part, where the host's
  structured rendering puts each tag.
`image_to_history_tag(picture)` turns a picture (bytes, a path, a PIL image) into the history's tag.
A picture the extension refuses leaves the hooks as the host's own refusal (`tgw/refusal.py`).
Settings `multimodal-<key>` override `params[key]` before `setup()`.
"""
from __future__ import annotations

import sys
from pathlib import Path


def _import_as_package() -> None:
    """Make `extensions.multimodal` this folder when the host loaded this file by its path.

    Today's text-generation-webui imports `user_data/extensions/NAME/script.py` as a loose module:
    the extension's own modules, and third-party pipeline modules (which import
    `extensions.multimodal.abstract_pipeline`), need the package name to point here.
    """
    here = Path(__file__).resolve().parent
    folder_packages = load_file_by_path("extensions.multimodal.core.folder_packages", here / "core" / "folder_packages.py")
    try:
        import extensions  # noqa: F401  (text-generation-webui's own extensions folder)
    except ImportError:
        folder_packages.register_package("extensions", [])
    # Fresh: modules of another copy, or of an earlier load of this one, must not mix with these.
    folder_packages.register_package("extensions.multimodal", [here], replace=True)
    sys.modules["extensions.multimodal.core.folder_packages"] = folder_packages
    sys.modules["extensions.multimodal.script"] = sys.modules[__name__]


def load_file_by_path(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ != "extensions.multimodal.script":
    _import_as_package()

from functools import partial  # noqa: E402
from typing import Any, Optional  # noqa: E402

import torch  # noqa: E402

from extensions.multimodal.core import (history_images, image_budget, loaded_model, prompt_encoding,  # noqa: E402
                                        served_model)
from extensions.multimodal.core.defaults import DEFAULT_PARAMS, IMAGE_TOKENS, MESSAGE_IMAGES, MODEL_ROUTE  # noqa: E402
from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, check_history_format, has_tag, ordinal  # noqa: E402
from extensions.multimodal.core.pipeline_loader import module_capability  # noqa: E402
from extensions.multimodal.core.placeholder_ban import HFPlaceholderBan, placeholder_ids  # noqa: E402
from extensions.multimodal.core.processor_loading import ProcessorLoadError  # noqa: E402
from extensions.multimodal.lean_host.placeholder_ban_batch import batch_ban_class  # noqa: E402
from extensions.multimodal.tgw import engine_model, serving  # noqa: E402
from extensions.multimodal.tgw.engine_client import engine_url  # noqa: E402
from extensions.multimodal.tgw.native_media import MEDIA_MARKER, stand_in_tag, with_state_pictures  # noqa: E402
from extensions.multimodal.tgw.refusal import host_errors  # noqa: E402
from extensions.multimodal.tgw.template_parts import use_parts_templates  # noqa: E402
from extensions.multimodal.tgw.template_tags import add_generation_tag  # noqa: E402
from modules import shared  # noqa: E402
from modules.logging_colors import logger  # noqa: E402
from modules.text_generation import encode, get_max_prompt_length  # noqa: E402

params = dict(DEFAULT_PARAMS)

# text-generation-webui's way for a UI to hand images to the next chat message:
# {'state': True, 'value': fn(text, visible_text) -> (text, visible_text)} applies once.
input_hijack = {"state": False, "value": ["", ""]}


def tgw_engine_set() -> bool:
    """Whether text-generation-webui was given a remote engine (tgw/remote_generation.py); this repository's
    host has its own (`--engine-url`), so there the setting, or a MULTIMODAL_ENGINE_URL left in the
    environment, changes nothing."""
    return bool(engine_url(params)) and not loaded_model.host_builds_routes()


def current_placeholder_ids() -> list[int]:
    pipeline = served_model.current_pipeline()
    return placeholder_ids(pipeline) if pipeline is not None else []


# Batch-level logits processor classes (this repository's host constructs them after setup(); other hosts
# have no such loader, `batch_ban_class` is None there and this list stays empty).
PlaceholderBan = batch_ban_class(current_placeholder_ids) if batch_ban_class is not None else None
logits_processors = [PlaceholderBan] if PlaceholderBan is not None else []


def setup() -> None:
    check_history_format(params["history_image_format"])
    register = module_capability(params, "register_auto_classes")
    registered = register() if register is not None else []
    logger.info(f"Multimodal: AutoModelForCausalLM loads {', '.join(registered) or 'no more'} image-text models whole")
    if add_generation_tag():
        logger.info("Multimodal: chat templates may use {% generation %} (llava-hf's do)")
    if use_parts_templates():
        logger.info("Multimodal: chat templates that take parts get each message's text and pictures as parts")
    served_model.forget()
    if tgw_engine_set():
        from extensions.multimodal.tgw import remote_generation

        engine_model.install()
        logger.info(f"Multimodal: replies come from the {remote_generation.client(params).description}; models load "
                    f"without their weights")
        if shared.model is not None and not getattr(shared.model, "answered_by_engine", False):
            logger.warning("Multimodal: the model was loaded with its weights before the extension (start text-"
                           "generation-webui through launch.py to load it without them); its replies come from the engine")
            engine_model.answered_by_engine(shared.model)
    if shared.model is None:
        logger.info("Multimodal: no model is loaded yet; the pipeline is picked when one is.")
    elif serving.extension_generates(params):
        try:
            serving.processor_route(params)  # builds the pipeline, which says its route
        except (ProcessorLoadError, ValueError) as error:  # said at load time: the model still serves text
            logger.warning(f"Multimodal: {type(shared.model).__name__} will not see pictures here: {error}")
    else:
        served_model.embedder(params)


def __getattr__(name: str):
    """`custom_generate_reply` exists while the extension generates for the loaded model (the host
    looks it up with hasattr before each reply); see tgw/generation.py."""
    if name == "custom_generate_reply" and not tgw_engine_set() and serving.extension_generates(params):
        from extensions.multimodal.tgw.generation import generate_reply

        return partial(generate_reply, caching=bool(params["prefix_cache"]), static_cache=params["static_cache"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ui() -> None:
    from extensions.multimodal.core import ui as multimodal_ui

    embeds_all = lambda: prompt_encoding.embeds_all_images(params, served_model.current_pipeline())  # noqa: E731
    multimodal_ui.create_ui(params, hijack_picture, embeds_all)


def image_to_history_tag(picture: Any, label: str = "the image") -> str:
    """A picture (bytes, a path, a PIL image) -> the history's tag: `<img src="data:image/jpeg;base64,...">`
    for a JPEG, `image/png` for anything else (stored losslessly)."""
    return history_images.store(picture, params, label).tag


def add_chat_picture(picture: Any, text: str, visible_text: str) -> tuple[str, str]:
    """text-generation-webui's helper for `input_hijack`: one picture into the next message."""
    return history_images.add_images_to_message([image_to_history_tag(picture)], text, visible_text or "")


def hijack_picture(picture: Any) -> None:
    """The single-picture UI (text-generation-webui): `picture` goes with the next message; None withdraws it."""
    if picture is None:
        input_hijack.update(state=False, value=["", ""])
    else:
        input_hijack.update(state=True, value=partial(add_chat_picture, picture))


def state_modifier(state: dict) -> dict:
    image_budget.check_request(state)
    if tgw_engine_set():
        from extensions.multimodal.tgw import remote_generation

        remote_generation.within_context(state, params)
    return state


@host_errors
def chat_input_modifier(text: str, visible_text: str, state: dict) -> tuple[str, str]:
    images = state.pop(MESSAGE_IMAGES, None) or []
    if images:
        label = lambda i, n: f"the {ordinal(i + 1)} image sent" if n > 1 else "the image"  # noqa: E731
        return history_images.add_images_to_message(history_images.history_tags(images, state, params, label),
                                                    text, visible_text)
    if input_hijack["state"]:
        input_hijack["state"] = False
        value = input_hijack["value"]
        return value(text, visible_text) if callable(value) else tuple(value)
    return text, visible_text


@host_errors
def custom_tokenized_length(prompt: str) -> Optional[int]:
    if MEDIA_MARKER in prompt:
        prompt = prompt.replace(MEDIA_MARKER, stand_in_tag())
    if tgw_engine_set():
        from extensions.multimodal.core.engine_prompt import measure

        return measure(prompt, params) if has_tag(prompt) else None
    if serving.processor_route(params):
        if not has_tag(prompt):
            return None  # the host measures text itself (every host falls back on None)
        return int(serving.route_inputs(prompt, {}, params)["input_ids"].shape[-1])
    return served_model.embedder(params).len_in_tokens(prompt)


@host_errors
def tokenizer_modifier(state: dict, prompt: str, input_ids: torch.Tensor, input_embeds: Optional[torch.Tensor]):
    if tgw_engine_set():
        from extensions.multimodal.tgw import remote_generation

        return prompt, remote_generation.open_reply(prompt, state, params), None
    # Only text-generation-webui writes markers or hands pictures over in the state (tgw/native_media.py).
    from_tgw = MEDIA_MARKER in prompt or bool(state.get("raw_images"))
    tagged = with_state_pictures(prompt, state, params) if from_tgw else prompt
    if not has_tag(tagged):
        if tagged == prompt:
            return prompt, input_ids, input_embeds
        # Markers without a picture, left out: the host's ids still hold them.
        return tagged, encode(tagged, add_bos_token=state["add_bos_token"],
                              truncation_length=get_max_prompt_length(state)), None
    if serving.processor_route(params):
        return prompt, serving.processor_route_ids(tagged, state, params), None
    embedded = served_model.embedder(params).forward(tagged, state)
    stats = embedded.stats
    logger.info(f"Multimodal: embedded {stats.images} image(s) in {stats.seconds:.2f} s ({stats.from_cache} from "
                f"cache; it holds {stats.cache_bytes / 2**20:.1f} of {params['embedding_cache_mb']} MiB)")
    if embedded.route is not None:
        # generate()'s inputs for this prompt (3-D positions, precomputed features): this repository's host
        # builds them with it, and so does tgw/generation.py where the extension generates; text-generation-
        # webui generates from the embeddings for any other model.
        state[MODEL_ROUTE] = embedded.route
    state[IMAGE_TOKENS] = embedded.image_tokens
    device, dtype = loaded_model.placement()
    return (prompt, embedded.input_ids.unsqueeze(0).to(device, torch.int64),
            embedded.inputs_embeds.unsqueeze(0).to(device, dtype))


@host_errors
def engine_prompt(prompt: str, state: dict) -> Optional[dict]:
    """This repository's host with a remote engine: the prompt's text around its pictures, the pictures as
    data URLs, the model's image placeholder and the budget's processor arguments; each picture's tokens
    go to `state['image_tokens']` (core/engine_prompt.py). None for a prompt without pictures."""
    from extensions.multimodal.core.engine_prompt import engine_prompt as for_engine

    return for_engine(prompt, state, params)


def image_tag_pattern():
    """This repository's host: the history tag's regex (named groups `mime`, `data`), so its chat shows pictures."""
    return IMAGE_TAG_RE


def image_placeholder():
    """This repository's host: the text the model's chat template writes for an image part, where its
    structured rendering puts each image's tag; None when the pipeline names none."""
    pipeline = served_model.current_pipeline()  # None: no model served yet
    return pipeline.chat_template_placeholder() if pipeline is not None else None


def logits_processor_modifier(processor_list, input_ids):
    """text-generation-webui's hook: ban the image placeholder ids where `PlaceholderBan` cannot run
    (none where the extension generates: Hugging Face's own generate bans none)."""
    pipeline = served_model.current_pipeline()
    if (PlaceholderBan is None and pipeline is not None and not serving.extension_generates(params)
            and not tgw_engine_set()):  # an engine runs no local logits processor
        processor_list.append(HFPlaceholderBan(placeholder_ids(pipeline)))
    return processor_list
