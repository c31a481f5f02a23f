"""How each family's language model takes a prompt with images: the `generate()` keyword arguments.

In: the full prompt's ids `(1, n)` (with the image ids `image_tokens` gives) and either the stitched
embeddings `(1, n, hidden)` (the host's, `multimodal_embedder.stitch`) or the per-image feature rows
`image_features.features_of` gives. Out: a dict for `model.generate(**kwargs, max_new_tokens=...)`;
add `past_key_values` for a prefix cache.

Routes (measured against `generate(**processor(...))`, tests/test_vlm_families_core.py):
- "embeds": `inputs_embeds` + `attention_mask`. LLaVA, LLaVA-NeXT, LLaVA-OneVision, Mistral3, Idefics3,
  SmolVLM, InternVL, Aya Vision.
- "embeds+mrope": the same plus 3-D rotary `position_ids` `(4, 1, n)` (row 0 text positions, rows
  1-3 from the model's `get_rope_index`), as Qwen's own `generate` builds them. Qwen2-VL, Qwen2.5-VL.
- "ids+features": `input_ids` with the real image ids plus the precomputed features through
  `generate(mm_encoder_outputs=...)` (transformers' own way to pass pre-encoded images: the tower
  does not run again), with the family's extras: Gemma 3 `token_type_ids` (an image's tokens
  attend to each other both ways); Qwen3-VL the same `position_ids` as Qwen2.5-VL and its DeepStack
  rows inside the features. Gemma 3 needs this route: its `prepare_inputs_for_generation` does not
  take `inputs_embeds`. It is also exact for every family above (tested), so a host may use it
  for all of them.
- "cross-attention": Mllama; images are not rows of the prompt (see `cross_attention.py`).

Prefix cache: every tensor here covers the full prompt; `generate` slices what the cache already
holds (`next_sequence_length`). That is exactly right for "embeds" and for the position ids (the
cached part keeps the positions it was computed with, because they are computed over the full
prompt every turn, from the ids and every image's grid; decode steps continue from the last
position + 1, which is `generate`'s own update). `mm_encoder_outputs` must hold only the rows of
image tokens the cache does not hold: pass `cached_length`.

A cache that is to be cropped must record the past of its sliding-window layers (Gemma 3, Aya
Vision's Cohere2, Mistral with a window): the caller makes it so (`DynamicCache.activate_past_recording`;
this repository's host: `modules/prefix_cache.new_cache`). Without it `crop` raises once the window is full.

With explicit `position_ids` Qwen's `rope_deltas` (state kept on the model between calls) is never
read, so a previous request cannot leak into this one.
"""
from __future__ import annotations

import inspect

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .image_tokens import image_token_id

EMBEDS = "embeds"
EMBEDS_MROPE = "embeds+mrope"
IDS_FEATURES = "ids+features"
CROSS_ATTENTION = "cross-attention"

ROUTES = {
    "llava": EMBEDS, "llava_next": EMBEDS, "llava_onevision": EMBEDS, "mistral3": EMBEDS, "idefics3": EMBEDS,
    "smolvlm": EMBEDS, "internvl": EMBEDS, "aya_vision": EMBEDS,
    "qwen2_vl": EMBEDS_MROPE, "qwen2_5_vl": EMBEDS_MROPE,
    "gemma3": IDS_FEATURES, "qwen3_vl": IDS_FEATURES,
    "mllama": CROSS_ATTENTION,
}
# Families whose language model needs 3-D rotary positions from get_rope_index.
MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def check_serves(pipeline_name: str, model, model_types: tuple | None) -> None:
    """Raises ValueError unless the pipeline called `pipeline_name` (for `model_types`; None: any) serves `model`."""
    model_type = getattr(model.config, "model_type", None)
    if model_types is not None and model_type not in model_types:
        raise ValueError(f"The '{pipeline_name}' pipeline serves {', '.join(model_types)} models; the loaded model "
                         f"is {type(model).__name__} ({model_type}). Use the 'transformers' pipeline.")
    if not supports(model):
        raise ValueError(f"The '{pipeline_name}' pipeline cannot serve {type(model).__name__} ({model_type}): it is "
                         f"not an image-text model this pipeline knows (known: {', '.join(sorted(ROUTES))}).")


def supports(model) -> bool:
    """Whether `model` is an image-text checkpoint of a family with a route here."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ROUTES:
        return False
    return ROUTES[model_type] == CROSS_ATTENTION or hasattr(model, "get_image_features")


def route_for(model) -> str:
    model_type = model.config.model_type
    if model_type not in ROUTES:
        raise ValueError(f"No image route for model type {model_type!r}; known: {', '.join(sorted(ROUTES))}")
    return ROUTES[model_type]


def routes_here(model) -> bool:
    """Whether the installed transformers' `generate` takes this family's prompt as built here: the
    "ids+features" route needs `mm_encoder_outputs` (transformers 5.23 and later); the cross-attention
    route is exact from 5.23 on (at 5.6, text-generation-webui's pin, Mllama's replies differ from
    Hugging Face's: measured)."""
    route = route_for(model)
    if route == IDS_FEATURES:
        return "mm_encoder_outputs" in inspect.signature(model.forward).parameters
    if route == CROSS_ATTENTION:
        import transformers

        return tuple(int(part) for part in transformers.__version__.split(".")[:2]) >= (5, 23)
    return True


def route_kwargs(model, route: str, input_ids: torch.Tensor, inputs_embeds: torch.Tensor, layouts: list,
                 features: list[torch.Tensor]):
    """The pipeline's `generate_kwargs` for `route`: a function of (cached length, cache) giving `generate()`'s
    keyword arguments. `layouts`, `features`: per embedded image, its `ImageLayout` and `embed_images` rows."""
    # Imported here, not above: launch.py reads ROUTES (through auto_classes.py) before text-generation-
    # webui's server.py runs, outside the extension's package, where these modules cannot be imported yet.
    from extensions.multimodal.abstract_pipeline import feature_rows

    from . import cross_attention

    if route == EMBEDS:  # with the real image ids (the host's may stand in for a pad id)
        return lambda cached_length, cache: embeds_kwargs(input_ids, inputs_embeds)
    # A tower on another device (the vision_device setting) leaves its rows there: the language model takes
    # them where it takes its inputs (found on an H200 with the language model on the CPU).
    lm_device = model.get_input_embeddings().weight.device
    features = [f if f is None else f.to(lm_device) for f in features]
    if any(f is None for f in features):
        raise ValueError(f"{type(model).__name__} needs every image of the prompt embedded (its positions "
                         f"or its image features cover them all): set multimodal-add_all_images_to_prompt "
                         f"to true, or leave it unset.")
    if route == CROSS_ATTENTION:
        tiles = [layout.info["tiles"] for layout in layouts]
        return lambda cached_length, cache: cross_attention.route_kwargs(model, input_ids, features, tiles,
                                                                         cached_length, cache)
    grids = [layout.info["image_grid_thw"] for layout in layouts if "image_grid_thw" in layout.info]
    grid = torch.cat(grids) if grids else None
    if route == EMBEDS_MROPE:
        kwargs = mrope_kwargs(model, input_ids, inputs_embeds, grid)
        return lambda cached_length, cache: kwargs  # covers the full prompt; generate() slices what is cached
    rows = [feature_rows(f) for f in features]
    deepstack = [f[:, 1:].transpose(0, 1) for f in features] if features and features[0].dim() == 3 else None
    return lambda cached_length, cache: features_kwargs(model, input_ids, rows, deepstack=deepstack,
                                                        image_grid_thw=grid, cached_length=cached_length)


def not_exact_here(model) -> str:
    """"" where the installed transformers takes this family's prompt as built here (`routes_here`); else why not."""
    if routes_here(model):
        return ""
    import transformers

    return f"transformers {transformers.__version__} cannot take its precomputed features (5.23 can)"


def embeds_kwargs(input_ids: torch.Tensor, inputs_embeds: torch.Tensor) -> dict:
    """Route "embeds": `inputs_embeds` `(1, n, hidden)`, an all-ones mask (ids may equal the pad id), and
    the ids: logits processors that read the prompt (a checkpoint's `repetition_penalty`, Qwen's 1.05)
    then see it, as in `generate(**processor(...))`; given embeddings alone they would see none of it."""
    mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
    return {"input_ids": input_ids, "inputs_embeds": inputs_embeds, "attention_mask": mask}


def mrope_position_ids(model, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """`(4, 1, n)`: text positions, then the model's 3-D rotary positions for the full prompt.

    `image_grid_thw` `(images, 3)`: every image in `input_ids`, in order (cached ones included: their
    positions shift everything after them). Equals what Qwen's `generate` builds from
    `processor(...)` output (`_prepare_position_ids_for_generation`).
    """
    attention_mask = torch.ones_like(input_ids)
    text_positions = (attention_mask.cumsum(-1) - 1)[None]  # (1, 1, n)
    image_tokens = input_ids == image_token_id(model)
    if image_grid_thw is None or not bool(image_tokens.any()):
        return torch.cat([text_positions, text_positions.expand(3, -1, -1)])
    rope, _ = model.model.get_rope_index(input_ids, mm_token_type_ids=image_tokens.int(),
                                         image_grid_thw=image_grid_thw.to(input_ids.device),
                                         attention_mask=attention_mask)
    return torch.cat([text_positions, rope.to(text_positions.device)])


def mrope_kwargs(model, input_ids: torch.Tensor, inputs_embeds: torch.Tensor,
                 image_grid_thw: torch.Tensor | None) -> dict:
    """Route "embeds+mrope": `embeds_kwargs` plus `position_ids` `(4, 1, n)`."""
    return {**embeds_kwargs(input_ids, inputs_embeds), "position_ids": mrope_position_ids(model, input_ids, image_grid_thw)}


def features_kwargs(model, input_ids: torch.Tensor, features: list[torch.Tensor], *,
                    deepstack: list[torch.Tensor] | None = None, image_grid_thw: torch.Tensor | None = None,
                    cached_length: int = 0) -> dict:
    """Route "ids+features": `input_ids` `(1, n)`, the features as `mm_encoder_outputs`, the family's extras.

    `features`: `(rows, hidden)` per image in `input_ids`, in order; `deepstack` (Qwen3-VL):
    `(layers, rows, hidden)` per image. `cached_length`: tokens a prefix cache already holds; only
    rows of image tokens after it are passed (the model counts image tokens in what it is given).
    """
    kwargs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    model_type = model.config.model_type
    image_tokens = input_ids == image_token_id(model)
    if model_type == "gemma3":
        kwargs["token_type_ids"] = image_tokens.long()
    if model_type in MROPE_FAMILIES:
        kwargs["position_ids"] = mrope_position_ids(model, input_ids, image_grid_thw)
    skip = int(image_tokens[:, :cached_length].sum())  # rows whose tokens the cache holds
    output = encoder_output(features, deepstack, skip, model_type)
    if output is not None:
        kwargs["mm_encoder_outputs"] = {"image": output}
    return kwargs


# Families whose forward concatenates `pooler_output` as a sequence of per-image tensors; the others
# (Gemma 3, Idefics3, SmolVLM, InternVL, Aya Vision) scatter one tensor of any leading shape.
PER_IMAGE_OUTPUT = ("llava", "llava_next", "llava_onevision", "mistral3") + MROPE_FAMILIES


def encoder_output(features: list[torch.Tensor], deepstack: list[torch.Tensor] | None, skip: int,
                   model_type: str) -> BaseModelOutputWithPooling | None:
    """What the family's `get_image_features` returns, without the first `skip` rows; None when nothing is left."""
    sizes = [f.shape[0] for f in features]
    rows = torch.cat(features)[skip:] if features else None
    if rows is None or rows.shape[0] == 0:
        return None
    if model_type not in PER_IMAGE_OUTPUT:
        return BaseModelOutputWithPooling(pooler_output=rows)
    kept = trimmed_sizes(sizes, skip)  # keep the per-image split (trimmed), for Qwen3-VL's DeepStack too
    pooler_output = tuple(torch.split(rows, kept))
    if deepstack is None:
        return BaseModelOutputWithPooling(pooler_output=pooler_output)
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    layers = torch.cat(deepstack, dim=1)[:, skip:]  # (layers, rows, hidden)
    return BaseModelOutputWithDeepstackFeatures(
        pooler_output=pooler_output, deepstack_features=[tuple(torch.split(layer, kept)) for layer in layers])


def trimmed_sizes(sizes: list[int], skip: int) -> list[int]:
    """Per-image row counts after dropping the first `skip` rows (images fully dropped disappear)."""
    kept = []
    for size in sizes:
        dropped = min(size, skip)
        skip -= dropped
        if size - dropped:
            kept.append(size - dropped)
    return kept
