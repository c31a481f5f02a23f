"""The extension's parameters and their defaults, and the host's state keys, written once.

`script.params` starts as a copy of `DEFAULT_PARAMS`; the host then applies the `multimodal-<key>`
settings to it. Pipelines and the embedder read params through `with_defaults`, so a caller that
passes a partial dict (tests, third-party code) gets the same defaults. This module imports nothing.
"""
from __future__ import annotations

from typing import Any, Optional

DEFAULT_PARAMS: dict[str, Any] = {
    # the pipeline to use (the `multimodal-pipeline` setting; `--multimodal-pipeline` wins where the host has it)
    "pipeline": None,
    # embed every image in the prompt, not only the last one (older ones get placeholder rows); None: the
    # pipeline's choice (transformers image-text models: every image, as their processor does; original LLaVA: the last)
    "add_all_images_to_prompt": None,
    # device to run the vision encoder on (None: the language model's device)
    "vision_device": None,
    # the vision encoder's precision: 32, 16 (bfloat16 on a CPU: it has no fast float16) or 'bf16';
    # None: the language model's (a transformers model's tower stays as loaded, as Hugging Face runs it)
    "vision_bits": None,
    # device to run the multimodal projector on
    "projector_device": None,
    # the projector's precision, likewise
    "projector_bits": None,
    # how the history stores pictures: "exact" (JPEG and PNG bytes as sent, others as lossless PNG: the model
    # sees exactly the picture sent) or "jpeg" (re-encoded at quality 90, the longest side capped: small histories)
    "history_image_format": "exact",
    # images larger than this many pixels are rejected before they are decoded
    "max_image_pixels": 40_000_000,
    # the most images embedded in one prompt (None: only the pipeline's own limit)
    "max_images_per_prompt": None,
    # what each picture may cost: "default" (the checkpoint's processor settings), "low" (at most 512x512
    # pixels), "high" (up to 2048x2048, never less than the default) or a number of pixels (image_budget.py)
    "image_budget": "default",
    # image embeddings kept between turns, in MiB (0 turns the cache off)
    "embedding_cache_mb": 256,
    # text-generation-webui, image-text checkpoints: keep the prompt's KV cache between turns, so a turn
    # prefills only its new tokens (this repository's host has its own: --no-prefix-cache)
    "prefix_cache": True,
    # text-generation-webui, image-text checkpoints: decode with a static KV cache (tgw/static_decode.py):
    # None: the default (off for now), True/False. It runs there without compile (text-generation-webui
    # disables torch._dynamo when it loads a model); this repository's host has --static-cache instead
    "static_cache": None,
    # more folders holding pipeline modules, searched after extensions/multimodal/pipelines/
    "pipeline_dirs": [],
    # original LLaVA checkpoints: a local CLIP folder instead of the hub repo the release used
    "vision_tower": None,
    # original LLaVA checkpoints: a local mm_projector .bin/.safetensors instead of the model folder's
    "projector_path": None,
    # text-generation-webui: the OpenAI-compatible URL of a vLLM server that generates the replies
    # ("http://host:8000/v1"; launch.py's --multimodal-engine-url); "" for the local model. The model folder
    # loaded then needs no weights (tgw/remote_generation.py). This repository's host has --engine-url instead.
    "engine_url": "",
    # its API key (launch.py's --multimodal-engine-api-key), and how long to wait for it, in seconds
    "engine_api_key": "",
    "engine_timeout": 120,
}


# The state keys this repository's host hands over (the extension, its UI and the host agree on them):
# the pictures sent with the user message being added (UI upload, API image parts), which the extension
# takes; and, when a model needs more than stitched embeddings, a function of the tokens a prefix cache
# holds that gives generate()'s keyword arguments.
MESSAGE_IMAGES = "message_images"
MODEL_ROUTE = "model_route"
# The message's or request's picture budget (image_budget.py); and what the extension reports back for
# the host to show: the prompt tokens of each picture kept (prompt order), and the pictures left out to
# fit the context (per picture, its turn, 1-based, and its place among that turn's pictures).
IMAGE_BUDGET = "image_budget"
IMAGE_TOKENS = "image_tokens"
DROPPED_IMAGES = "dropped_images"
# In hosts that build generate()'s inputs themselves (text-generation-webui): the processor's tensors
# beside the ids the tokenizer hook returned, for the one generate() call of this reply.
PROCESSOR_INPUTS = "multimodal_processor_inputs"


def with_defaults(params: Optional[dict]) -> dict:
    return {**DEFAULT_PARAMS, **(params or {})}


def max_image_pixels(params: Optional[dict]) -> int:
    """The `max_image_pixels` param; unset (None or 0) means the default, never no limit."""
    return int((params or {}).get("max_image_pixels") or DEFAULT_PARAMS["max_image_pixels"])


def wants_bos(state: dict) -> bool:
    """The state's `add_bos_token`; unset (measuring a prompt without a state), True: the hosts' `encode()` default."""
    return bool(state.get("add_bos_token", True))
