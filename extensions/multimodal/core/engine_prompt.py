"""A prompt with picture tags as a remote engine takes it (this repository's host with `--engine-url`, and
text-generation-webui with the extension's engine: tgw/remote_generation.py).

The engine (vLLM) gets the prompt's text with each tag replaced by the text the model's chat template
writes for a picture, and the pictures themselves: the bytes each tag holds, as data URLs (a 16-bit
greyscale PNG as the 8-bit pixels read here: `image_codec.as_read_data_url`). Its own
processor expands each placeholder, as the checkpoint's processor does here, so the costs this module
reports (`state[IMAGE_TOKENS]`, from the same layouts the local engine uses) are the engine's.
Every picture in the prompt is sent whole: an engine takes no placeholder rows, so the setting that
embeds only the newest picture (`add_all_images_to_prompt` off) does not apply, and each picture is
counted at its own layout. A prompt that would fit only by cutting into its pictures or text is
refused: the host drops whole turns first, and an engine's prompt cannot start in the middle of one.
"""
from __future__ import annotations

from typing import Optional

from extensions.multimodal.core import image_budget, served_model
from extensions.multimodal.core.defaults import IMAGE_TOKENS, max_image_pixels, wants_bos
from extensions.multimodal.core.image_codec import as_read_data_url, find_tags
from extensions.multimodal.core.prompt_encoding import PromptEncoder, PromptTooLongError
from extensions.multimodal.core.prompt_parts import count_images, n_tokens
from modules.text_generation import get_max_prompt_length

_encoder: tuple = (None, None)  # (the embedder it counts for, a PromptEncoder that lays out every picture)


def engine_prompt(prompt: str, state: dict, params: dict) -> Optional[dict]:
    """`{"pieces": texts around the pictures, "images": data URLs, "placeholder", "processor_kwargs"}`,
    or None for a prompt without pictures. Records each picture's prompt tokens in `state[IMAGE_TOKENS]`."""
    tags = list(find_tags(prompt))
    if not tags:
        return None
    embedder = served_model.embedder(params)
    pipeline = embedder.pipeline
    placeholder = pipeline.chat_template_placeholder()
    if not placeholder:
        raise ValueError(f"The pipeline '{pipeline.name()}' names no image placeholder, so a remote engine cannot "
                         f"be sent its pictures; use the local engine for this model.")
    budget = image_budget.resolve(state, params)
    encoder = whole_picture_encoder(embedder)
    parts = encoder.assign_ids(encoder.split(prompt), wants_bos(state), budget)
    needed, room = sum(n_tokens(part) for part in parts), get_max_prompt_length(state)
    if needed > room:
        raise PromptTooLongError(
            f"The prompt needs {needed} tokens, {count_images(parts)} picture(s) included, but only {room} fit "
            f"(truncation_length - max_new_tokens) even with the last turn alone, and the engine takes whole turns: "
            f"send fewer or smaller pictures (a lower picture budget), or lower max_new_tokens.")
    state[IMAGE_TOKENS] = [n_tokens(part) for part in parts if part.is_image]
    pieces = [prompt[start:end] for start, end in zip([0] + [tag.end for tag in tags],
                                                      [tag.start for tag in tags] + [len(prompt)])]
    return {"pieces": pieces, "images": [as_read_data_url(tag, max_image_pixels(params)) for tag in tags],
            "placeholder": placeholder, "processor_kwargs": pipeline.processor_kwargs(budget)}


def measure(prompt: str, params: dict) -> int:
    """The prompt's length in tokens as the engine takes it (every picture whole, at the setting's budget)."""
    embedder = served_model.embedder(params)
    return whole_picture_encoder(embedder).measure(prompt, image_budget.resolve({}, params))


def whole_picture_encoder(embedder) -> PromptEncoder:
    """A PromptEncoder for `embedder`'s pipeline that lays out every picture as an embedded one."""
    global _encoder
    if _encoder[0] is not embedder:
        # nothing is embedded here: it keeps no laid-out pictures for embedding them (`embedding_cache_mb` 0)
        params = {**embedder.params, "add_all_images_to_prompt": True, "embedding_cache_mb": 0}
        _encoder = (embedder, PromptEncoder(embedder.pipeline, params))
    return _encoder[1]
