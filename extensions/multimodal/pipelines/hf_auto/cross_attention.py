"""Mllama (Llama 3.2 Vision): images through cross-attention layers, not as rows of the prompt.

In the prompt an image is one `<|image|>` token; its tiles' vision states are keys and values of
the language model's cross-attention layers, and `cross_attention_mask` `(1, n, images, tiles)`
says which images each token may see (an image and everything after it, until the next image).

`generate()` cannot take precomputed `cross_attention_states`: it passes every keyword again at
each decoding step, and the cross-attention layers append them to the cache each time (the key
count doubles and the mask no longer fits). So the route here prefills all but the last prompt
token with one forward pass given the states, and `generate` continues from that cache: the
cross-attention layers then read their keys and values from the cache only.

Prefix cache: `DynamicCache.crop` would cut the cross-attention layers' vision keys as if they were
tokens, so `reuse_cache` crops the self-attention layers only. A cache is reused only while the
prompt's images are the same ones, in the same order: the tokens before the first image attend to
every image (their cross-attention mask row is empty, which Mllama turns into uniform attention over
all the states, only the MLP part being masked), so adding or changing an image changes every
token's states. Otherwise the cache is emptied and the whole prompt prefilled with the new states.

In the host, an image's features (`image_features`) are `(1, 1 + states, hidden)`: the row for its
`<|image|>` token, then the states. The model takes ids, so that row only keys the host's prefix
cache, which compares the prompt's embeddings: it is the mean of the image's states, so two pictures
never share a cached prefix past their `<|image|>` token.
"""
from __future__ import annotations

import re
import weakref

import torch
from transformers import DynamicCache

from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
from extensions.multimodal.core.loaded_model import placed

from .image_features import vision_device_dtype
from .image_tokens import ProcessedImages, image_token_id

LEADING_IMAGES = re.compile(f"(?:{IMAGE_TAG_RE.pattern})*")


def with_bos(prompt: str, bos: str | None) -> str:
    """Mllama's processor writes a BOS, after any leading images (tags), into a text that holds none (its
    `build_string_from_input`)."""
    if not bos or bos in prompt:
        return prompt
    start = LEADING_IMAGES.match(prompt).end()
    return prompt[:start] + bos + prompt[start:]


def cross_attention_states(model, processed: ProcessedImages) -> list[torch.Tensor]:
    """`(max_tiles * patches, hidden)` per image: the projected vision states the LM attends to."""
    inner = model.model
    device, dtype = vision_device_dtype(model)  # `vision_device` / `vision_bits` may have moved the tower
    inputs = {name: placed(processed.inputs[name], device, dtype)
              for name in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}
    with torch.inference_mode():
        vision = inner.vision_model(**inputs).last_hidden_state
        states = inner.multi_modal_projector(vision)  # (1, images, tiles, patches, hidden)
    return list(states.reshape(len(processed.tokens), -1, states.shape[-1]))


def image_features(model, processed: ProcessedImages) -> list[torch.Tensor]:
    """`(1, 1 + states, hidden)` per image: the row that keys the prefix cache, then its states."""
    return [torch.cat([states.mean(0, keepdim=True), states])[None]
            for states in cross_attention_states(model, processed)]


# Per cache, the features whose states its cross-attention layers hold (filled by `route_kwargs`).
_held: "weakref.WeakKeyDictionary[DynamicCache, list[torch.Tensor]]" = weakref.WeakKeyDictionary()


def route_kwargs(model, input_ids: torch.Tensor, features: list[torch.Tensor], tiles: list[int],
                 cached_length: int, cache: DynamicCache | None) -> dict:
    """`cross_attention_kwargs` for the host's route: `features` as `image_features` gives them, `cache`
    the host's prefix cache holding `cached_length` of this prompt's tokens (None: no reuse)."""
    if not features:  # truncation left no picture: a text prompt, which Hugging Face runs without cross-attention
        kwargs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        if cache is not None:
            reuse_cache(model, cache, 0 if _held.pop(cache, None) else cached_length, keep_vision=False)
            kwargs["past_key_values"] = cache
        return kwargs
    held = _held.get(cache) if cache is not None else None
    same_images = held is not None and len(held) == len(features) and all(
        a is b or torch.equal(a, b) for a, b in zip(held, features))
    states = [f[0, 1:] for f in features]
    kwargs = cross_attention_kwargs(model, input_ids, states, tiles, model.config.vision_config.max_num_tiles,
                                    cache, cached_length, same_images)
    _held[kwargs["past_key_values"]] = list(features)
    return kwargs


def tiles_per_image(processed: ProcessedImages) -> list[int]:
    """Tiles each image was cut into (the rest of `max_tiles` is padding the mask hides)."""
    return [int(n) for n in processed.inputs["aspect_ratio_mask"][0].sum(-1)]


def cross_attention_mask(model, input_ids: torch.Tensor, tiles: list[int], max_tiles: int) -> torch.Tensor:
    """`(1, n, images, max_tiles)`, as `MllamaProcessor` builds it from the prompt's ids."""
    from transformers.models.mllama.processing_mllama import (convert_sparse_cross_attention_mask_to_dense,
                                                              get_cross_attention_token_mask)

    sparse = get_cross_attention_token_mask(input_ids[0].tolist(), image_token_id(model))
    dense = convert_sparse_cross_attention_mask_to_dense([sparse], num_tiles=[tiles], max_num_tiles=max_tiles,
                                                         length=input_ids.shape[1])
    return torch.from_numpy(dense).to(input_ids.device)


def cross_attention_kwargs(model, input_ids: torch.Tensor, states: list[torch.Tensor], tiles: list[int],
                           max_tiles: int, cache: DynamicCache | None = None, cached_length: int = 0,
                           same_images: bool = False) -> dict:
    """`generate()` kwargs with a cache prefilled on all but the last prompt token (see the module docstring).

    `cache`, `cached_length`: a previous turn's cache whose first `cached_length` tokens equal this
    prompt's; `same_images`: its cross-attention layers hold exactly `states` (same images, same order).
    """
    mask = cross_attention_mask(model, input_ids, tiles, max_tiles)
    attention_mask = torch.ones_like(input_ids)
    if cache is None:
        cache, cached_length, same_images = DynamicCache(config=model.config), 0, False
    if not same_images:  # every token attended to the old images (see the module docstring)
        cached_length = 0
    reuse_cache(model, cache, cached_length, keep_vision=same_images)
    fresh_states = torch.cat(states)[None] if states and not same_images else None
    with torch.inference_mode():
        if input_ids.shape[1] - 1 > cached_length:
            model(input_ids=input_ids[:, cached_length:-1], attention_mask=attention_mask[:, :-1],
                  cross_attention_mask=mask[:, cached_length:-1], cross_attention_states=fresh_states,
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "cross_attention_mask": mask,
            "past_key_values": cache}


def reuse_cache(model, cache: DynamicCache, cached_length: int, keep_vision: bool) -> None:
    """Crop the self-attention layers to `cached_length` tokens; empty the cross-attention ones unless kept."""
    cross_layers = set(model.config.get_text_config().cross_attention_layers)
    for index, layer in enumerate(cache.layers):
        if not layer.is_initialized:
            continue
        if index not in cross_layers:
            layer.crop(cached_length - layer.get_seq_length())
        elif not keep_vision:
            layer.crop(-layer.keys.shape[-2])
