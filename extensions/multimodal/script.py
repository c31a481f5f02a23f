"""The multimodal extension: lets a local vision-language model see the images in a chat.

It runs unchanged in this repository's host and in text-generation-webui, old (the versions that
shipped the original extension) and current (whose Transformers loader has no vision), from
`extensions/multimodal/` or, in the current one, `user_data/extensions/multimodal/`. Of the host it
uses only names every one of them has (`modules.shared`, `modules.text_generation.encode` /
`get_max_prompt_length`, `modules.logging_colors.logger`), and on the processor route, which only
today's text-generation-webui takes, its `generate_reply_HF`; anything more is feature-detected.

Hooks, in the order the host calls them:
- `setup()`: lets the host's `AutoModelForCausalLM` load image-text checkpoints as their full class
  (`hf_auto/auto_classes.py`) and its template environment render `{% generation %}`
  (`template_tags.py`) and messages as parts (`template_parts.py`), then loads the pipeline (`--multimodal-pipeline`, else the
  `multimodal-pipeline` setting, else recognised from the model); raises a RuntimeError listing the
  available pipelines when a model is loaded and none fits. With no model loaded yet (a host started
  without one) the pipeline is picked when a model is; it is picked again whenever the model changes.
  Runs without a UI.
- `ui()`: the image input (extensions/multimodal/ui.py), built inside the host's Gradio layout.
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
  (extensions/multimodal/placeholder_ban.py). This repository's host constructs the batch-level
  `logits_processors` after `setup()` instead, and this hook adds nothing.
- `image_tag_pattern()`, `image_placeholder()` (this repository's host only): the tag's regex, so its chat
  renders the pictures; the text the chat template writes for an image part, where the host's
  structured rendering puts each tag.
`image_to_history_tag(picture)` turns a picture (bytes, a path, a PIL image) into the history's tag.
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
    folder_packages = load_file_by_path("extensions.multimodal.folder_packages", here / "folder_packages.py")
    try:
        import extensions  # noqa: F401  (text-generation-webui's own extensions folder)
    except ImportError:
        folder_packages.register_package("extensions", [])
    # Fresh: modules of another copy, or of an earlier load of this one, must not mix with these.
    folder_packages.register_package("extensions.multimodal", [here], replace=True)
    sys.modules["extensions.multimodal.folder_packages"] = folder_packages
    sys.modules["extensions.multimodal.script"] = sys.modules[__name__]


def load_file_by_path(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ != "extensions.multimodal.script":
    _import_as_package()

import html  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any, Optional  # noqa: E402

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from extensions.multimodal import loaded_model  # noqa: E402
from extensions.multimodal import image_budget, notices, prompt_encoding  # noqa: E402
from extensions.multimodal.defaults import (DEFAULT_PARAMS, IMAGE_TOKENS, MESSAGE_IMAGES,  # noqa: E402
                                            MODEL_ROUTE, PROCESSOR_INPUTS, max_image_pixels)
from extensions.multimodal.image_codec import (IMAGE_TAG_RE, ImageDecodeError, Stored,  # noqa: E402
                                               check_history_format, ordinal, store_bytes, store_image)
from extensions.multimodal.multimodal_embedder import MultimodalEmbedder  # noqa: E402
from extensions.multimodal.native_media import MEDIA_MARKER, markers_to_tags  # noqa: E402
from extensions.multimodal.pipelines.hf_auto import budget_kwargs  # noqa: E402
from extensions.multimodal.pipelines.hf_auto.auto_classes import register_image_text_classes  # noqa: E402
from extensions.multimodal.pipelines.hf_auto.processor_route import processor_inputs  # noqa: E402
from extensions.multimodal.pipelines.hf_auto.image_tokens import LayoutUnavailable  # noqa: E402
from extensions.multimodal.pipelines.hf_auto.routes import ROUTES  # noqa: E402
from extensions.multimodal.placeholder_ban import HFPlaceholderBan, placeholder_ids  # noqa: E402
from extensions.multimodal.processor_loading import ProcessorLoadError  # noqa: E402
from extensions.multimodal.refusal import host_errors  # noqa: E402
from extensions.multimodal.template_parts import use_parts_templates  # noqa: E402
from extensions.multimodal.template_tags import add_generation_tag  # noqa: E402
from modules import shared  # noqa: E402
from modules.logging_colors import logger  # noqa: E402

try:
    from extensions.multimodal.placeholder_ban_batch import batch_ban_class
except ImportError as error:  # a host without batch-level processors (text-generation-webui)
    if error.name != "modules.logits_processors":
        raise
    batch_ban_class = None

params = dict(DEFAULT_PARAMS)

# text-generation-webui's way for a UI to hand images to the next chat message:
# {'state': True, 'value': fn(text, visible_text) -> (text, visible_text)} applies once.
input_hijack = {"state": False, "value": ["", ""]}

multimodal_embedder: Optional[MultimodalEmbedder] = None
_embedder_model: Any = None  # the model `multimodal_embedder` was built for
_processor_route_model: Any = None  # the model the embedder cannot serve here (see processor_route)

# Longest side stored in history when the pipeline states no preference (keeps histories small).
DEFAULT_HISTORY_MAX_SIDE = 1024
IMAGE_PLACEHOLDER = "<image>"


def current_embedder() -> Optional[MultimodalEmbedder]:
    """The embedder built for the loaded model, if one is (None on the processor route, or before
    the first image prompt after the model changed)."""
    fresh = multimodal_embedder is not None and _embedder_model is shared.model
    return multimodal_embedder if fresh else None


def current_pipeline():
    """The current embedder's pipeline, or None (see `current_embedder`)."""
    current = current_embedder()
    return current.pipeline if current is not None else None


def current_placeholder_ids() -> list[int]:
    pipeline = current_pipeline()
    return placeholder_ids(pipeline) if pipeline is not None else []


# Batch-level logits processor classes; the host constructs them after setup() (other hosts ignore this).
PlaceholderBan = batch_ban_class(current_placeholder_ids) if batch_ban_class is not None else None
logits_processors = [PlaceholderBan] if PlaceholderBan is not None else []


def setup() -> None:
    global multimodal_embedder, _embedder_model
    check_history_format(params["history_image_format"])
    registered = register_image_text_classes()
    logger.info(f"Multimodal: AutoModelForCausalLM loads {', '.join(registered) or 'no more'} image-text models whole")
    if add_generation_tag():
        logger.info("Multimodal: chat templates may use {% generation %} (llava-hf's do)")
    if use_parts_templates():
        logger.info("Multimodal: chat templates that take parts get each message's text and pictures as parts")
    multimodal_embedder, _embedder_model = None, None
    if shared.model is None:
        logger.info("Multimodal: no model is loaded yet; the pipeline is picked when one is.")
    elif extension_generates():
        try:
            processor_route()  # picks the route: the embedder where it serves this family here
        except (ProcessorLoadError, ValueError) as error:  # said at load time: the model still serves text
            logger.warning(f"Multimodal: {type(shared.model).__name__} will not see pictures here: {error}")
    else:
        embedder()


def extension_generates() -> bool:
    """Whether this extension drives `generate()` for the loaded model: an image-text family, in a host
    that builds `generate()`'s inputs itself (text-generation-webui; tgw/generation.py)."""
    model_type = getattr(getattr(shared.model, "config", None), "model_type", None)
    return model_type in ROUTES and not loaded_model.host_builds_routes()


def processor_route() -> bool:
    """Whether the loaded model takes its pictures through its own processor and `generate()` (the tower
    inside generate, every turn): where the extension generates, for a family the installed transformers
    cannot serve on the embedder's route (`LayoutUnavailable`: text-generation-webui's pinned 5.6 gives
    no processor replacement offsets and no `mm_encoder_outputs`). Elsewhere the embedder serves it."""
    global _processor_route_model
    if not extension_generates():
        return False
    if _processor_route_model is not shared.model and current_embedder() is None:
        try:
            embedder()
        except LayoutUnavailable as error:
            logger.info(f"Multimodal: {type(shared.model).__name__} through its processor, the tower inside "
                        f"generate on every turn: {error}")
            _processor_route_model = shared.model
    return _processor_route_model is shared.model


def __getattr__(name: str):
    """`custom_generate_reply` exists while the extension generates for the loaded model (the host
    looks it up with hasattr before each reply); see tgw/generation.py."""
    if name == "custom_generate_reply" and extension_generates():
        from extensions.multimodal.tgw.generation import generate_reply

        return partial(generate_reply, caching=bool(params["prefix_cache"]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ui() -> None:
    from extensions.multimodal import ui as multimodal_ui

    multimodal_ui.create_ui(params, hijack_picture, embeds_all_images)


def embeds_all_images() -> bool:
    """Whether every image of a prompt is embedded now (the setting, else the pipeline's choice)."""
    return prompt_encoding.embeds_all_images(params, current_pipeline())


def embedder() -> MultimodalEmbedder:
    """The embedder for the loaded model, built when the model was loaded or changed since."""
    global multimodal_embedder, _embedder_model
    if shared.model is None:
        raise RuntimeError("No model is loaded: load one to send it pictures.")
    if multimodal_embedder is None or _embedder_model is not shared.model:
        multimodal_embedder, _embedder_model = None, None  # a failed pick leaves no stale embedder behind
        multimodal_embedder, _embedder_model = MultimodalEmbedder(params), shared.model
    return multimodal_embedder


# -- Images into the chat ---------------------------------------------------------------------

def history_max_side() -> int:
    """The longest side the `jpeg` history format keeps: the pipeline's preference, else a default."""
    pipeline = current_pipeline()
    preferred = pipeline.preferred_image_size() if hasattr(pipeline, "preferred_image_size") else None
    return int(preferred) if preferred else DEFAULT_HISTORY_MAX_SIDE


def store(picture: Any, label: str = "the image") -> Stored:
    """A file path, bytes, a PIL image or a Gradio file dict -> what the history keeps of it.

    Exactly the picture sent (JPEG and PNG bytes as they came, other formats as a lossless PNG),
    unless the `history_image_format` param is `jpeg`. Raises ImageDecodeError naming the cause.
    """
    history_format, max_side = params["history_image_format"], history_max_side()
    if isinstance(picture, dict) and "path" in picture:
        picture = picture["path"]
    if isinstance(picture, Image.Image):
        return store_image(picture, history_format, max_side)
    if isinstance(picture, (str, Path)):
        try:
            picture = Path(picture).read_bytes()
        except OSError as error:
            raise ImageDecodeError(f"Cannot read {label} from {picture}: {error}") from error
    if isinstance(picture, (bytes, bytearray)):
        return store_bytes(bytes(picture), max_image_pixels(params), label, history_format, max_side)
    raise ImageDecodeError(f"Cannot read {label}: expected a file path, bytes or a PIL image, got {type(picture).__name__}")


def image_to_history_tag(picture: Any, label: str = "the image") -> str:
    """A picture (as `store` takes it) -> the history's tag: `<img src="data:image/jpeg;base64,...">` for
    a JPEG, `image/png` for anything else (stored losslessly)."""
    return store(picture, label).tag


def history_tags(pictures: list, state: Optional[dict], label_of=lambda i, n: "the image") -> list[str]:
    """The tags of `pictures`; when the `jpeg` history format changed any, `state['notices']` says so."""
    stored = [store(picture, label_of(i, len(pictures))) for i, picture in enumerate(pictures)]
    changed = sum(item.changed for item in stored)
    if changed and state is not None:
        notices.tell(state, f"{changed} picture(s) stored as JPEG (at most {history_max_side()} px) because of "
                            f"multimodal-history_image_format: jpeg; the model sees that JPEG, not the exact picture.",
                     level="info")
    return [item.tag for item in stored]


def add_images_to_message(tags: list[str], text: str, visible_text: str) -> tuple[str, str]:
    """Each `<image>` in the text takes the next tag; remaining tags go before the text."""
    text, rest = fill_placeholders(text, IMAGE_PLACEHOLDER, tags)
    visible_text, visible_rest = fill_placeholders(visible_text, html.escape(IMAGE_PLACEHOLDER), tags)
    if rest:
        text = "\n".join(rest + [text]) if text else "\n".join(rest)
    if visible_rest:
        visible_text = "\n".join(visible_rest + [visible_text]) if visible_text else "\n".join(visible_rest)
    return text, visible_text


def fill_placeholders(text: str, placeholder: str, tags: list[str]) -> tuple[str, list[str]]:
    pieces = text.split(placeholder)
    used = min(len(pieces) - 1, len(tags))
    filled = "".join(piece + tags[i] for i, piece in enumerate(pieces[:used])) + placeholder.join(pieces[used:])
    return filled, tags[used:]


def add_chat_picture(picture: Any, text: str, visible_text: str) -> tuple[str, str]:
    """text-generation-webui's helper for `input_hijack`: one picture into the next message."""
    return add_images_to_message([image_to_history_tag(picture)], text, visible_text or "")


def hijack_picture(picture: Any) -> None:
    """The single-picture UI (text-generation-webui): `picture` goes with the next message; None withdraws it."""
    if picture is None:
        input_hijack.update(state=False, value=["", ""])
    else:
        input_hijack.update(state=True, value=partial(add_chat_picture, picture))


@host_errors
def chat_input_modifier(text: str, visible_text: str, state: dict) -> tuple[str, str]:
    images = state.pop(MESSAGE_IMAGES, None) or []
    if images:
        tags = history_tags(images, state, lambda i, n: f"the {ordinal(i + 1)} image sent" if n > 1 else "the image")
        return add_images_to_message(tags, text, visible_text)
    if input_hijack["state"]:
        input_hijack["state"] = False
        value = input_hijack["value"]
        return value(text, visible_text) if callable(value) else tuple(value)
    return text, visible_text


# -- Model inputs ---------------------------------------------------------------------------

def media_to_tags(prompt: str, state: dict) -> str:
    """text-generation-webui's `<__media__>` markers -> the tags of the pictures `state` carries."""
    prompt, missing, left_out = markers_to_tags(
        prompt, state, lambda picture, label: history_tags([picture], state, lambda i, n: label)[0])
    if missing:
        notices.tell(state, f"{missing} {MEDIA_MARKER} marker(s) in the prompt had no picture in the request "
                            f"and were left out.")
    for cause in left_out:
        notices.tell(state, f"A picture of an earlier message was left out: {cause}")
    return prompt


_stand_in_tag: list[str] = []


def stand_in_tag() -> str:
    """The tag of a blank picture, standing in for a `<__media__>` marker when a prompt is only measured
    (text-generation-webui measures prompts without their state, so the real picture is not known)."""
    if not _stand_in_tag:
        _stand_in_tag.append(store_image(Image.new("RGB", (history_max_side(),) * 2, (127, 127, 127))).tag)
    return _stand_in_tag[0]


@host_errors
def custom_tokenized_length(prompt: str) -> Optional[int]:
    if MEDIA_MARKER in prompt:
        prompt = prompt.replace(MEDIA_MARKER, stand_in_tag())
    if processor_route():
        if IMAGE_TAG_RE.search(prompt) is None:
            return None  # the host measures text itself (every host falls back on None)
        return int(route_inputs(prompt, add_bos=False, state={})["input_ids"].shape[-1])
    return embedder().len_in_tokens(prompt)


def route_inputs(tagged: str, add_bos: bool, state: dict):
    """The processor's inputs for `tagged`, its pictures at the message's or the setting's budget."""
    processor = loaded_model.processor()
    kwargs = budget_kwargs.images_kwargs(shared.model.config.model_type, processor.image_processor,
                                         image_budget.resolve(state, params))
    return processor_inputs(processor, tagged, add_bos, max_image_pixels(params), kwargs)


@host_errors
def tokenizer_modifier(state: dict, prompt: str, input_ids: torch.Tensor, input_embeds: Optional[torch.Tensor]):
    tagged = media_to_tags(prompt, state) if MEDIA_MARKER in prompt else prompt
    if IMAGE_TAG_RE.search(tagged) is None:
        return prompt, input_ids, input_embeds
    if processor_route():
        return prompt, processor_route_ids(tagged, state), None
    embedded = embedder().forward(tagged, state)
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


def processor_route_ids(tagged: str, state: dict) -> torch.Tensor:
    """The processor's ids for `tagged`; its other tensors go to `state[PROCESSOR_INPUTS]` for generate()."""
    inputs = route_inputs(tagged, add_bos=bool(state.get("add_bos_token", False)), state=state)
    device, dtype = loaded_model.placement()
    tensors = {key: loaded_model.placed(value, device, dtype) for key, value in inputs.items()}
    ids = tensors.pop("input_ids")
    state[PROCESSOR_INPUTS] = tensors
    logger.info(f"Multimodal: {ids.shape[-1]} prompt tokens through {type(loaded_model.processor()).__name__}")
    return ids


def image_tag_pattern():
    """The history tag's regex (named groups `mime`, `data`), for hosts that render it as a picture."""
    return IMAGE_TAG_RE


def image_placeholder():
    """The text the model's chat template writes for an image part, where the host puts each image's tag
    when it renders structured chat messages (this repository's host); None when the pipeline names none."""
    placeholder = getattr(current_pipeline(), "chat_template_placeholder", None)
    return placeholder() if placeholder is not None else None


def logits_processor_modifier(processor_list, input_ids):
    """text-generation-webui's hook: ban the image placeholder ids where `PlaceholderBan` cannot run."""
    pipeline = current_pipeline()
    if PlaceholderBan is None and pipeline is not None and not extension_generates():
        processor_list.append(HFPlaceholderBan(placeholder_ids(pipeline)))  # (Hugging Face's generate bans none)
    return processor_list
