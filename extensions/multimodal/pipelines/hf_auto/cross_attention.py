"""Mllama (Llama 3.2 Vision): images through cross-attention layers, not as rows of the prompt.

In the prompt an image is one `<|image|>` token; its tiles' vision states are keys and values of
the language model's cross-attention layers, and `cross_attention_mask` `(1, n, images, tiles)`
says which images each token may see (an image and everything after it, until the next image).

`generate()` cannot take precomputed `cross_attention_states`: it passes every keyword again at
each decoding step, and the cross-attention layers append them to the cache each time (the key
count doubles and the mask no longer fits). So the route here prefills all but the last prompt
token with one forward pass given the states, and `generate` continues from that cache: the
cross-attention layers then read their keys and values from the cache only.

Not covered: a prefix cache across turns. `DynamicCache.crop` would cut the cross-attention
layers' vision keys as if they were tokens; reuse needs cropping the self-attention layers only and
re-filling the cross-attention layers when an image is added.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .image_tokens import ProcessedImages, image_token_id


def cross_attention_states(model, processed: ProcessedImages) -> list[torch.Tensor]:
    """`(max_tiles * patches, hidden)` per image: the projected vision states the LM attends to."""
    inner = model.model
    inputs = processed.inputs
    with torch.inference_mode():
        vision = inner.vision_model(pixel_values=inputs["pixel_values"].to(inner.vision_model.dtype),
                                    aspect_ratio_ids=inputs["aspect_ratio_ids"],
                                    aspect_ratio_mask=inputs["aspect_ratio_mask"]).last_hidden_state
        states = inner.multi_modal_projector(vision)  # (1, images, tiles, patches, hidden)
    return list(states.reshape(len(processed.tokens), -1, states.shape[-1]))


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
                           max_tiles: int) -> dict:
    """`generate()` kwargs with a cache prefilled on all but the last prompt token (see the module docstring)."""
    mask = cross_attention_mask(model, input_ids, tiles, max_tiles)
    attention_mask = torch.ones_like(input_ids)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
              cross_attention_mask=mask[:, :-1], cross_attention_states=torch.cat(states)[None],
              past_key_values=cache, use_cache=True, logits_to_keep=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "cross_attention_mask": mask,
            "past_key_values": cache}
