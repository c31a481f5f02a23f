"""A new picture is decoded and run through the processor once in a turn, not once per step.

A host measures the prompt (`len_in_tokens`) before it embeds it (`forward`); the picture is laid out
in the first step (decoded, processed) and embedded in the second. What the first made of it (the
decoded picture, the processor's tensors: `ImageLayout.prepared`) is kept, bounded as the embedding
cache is, for the second. Differential: an embedder that keeps nothing between the steps
(`embedding_cache_mb: 0`) gives the same ids and embeddings, with a decode and a processor run more
per picture. Real llava-hf and LLaVA-NeXT checkpoints with their processors; the counts are of the
codec's decode and of the pipeline's processor calls, wrapped here.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image


@pytest.fixture(params=["llava", "llava_next"])
def hf_model(request, host, llava_dir, llava_next_dir):
    host.load(llava_dir if request.param == "llava" else llava_next_dir)
    return request.param


def picture_tag(width: int, height: int, seed: int) -> str:
    from extensions.multimodal.core.image_codec import image_to_png_bytes, make_tag

    rng = np.random.default_rng(seed)
    return make_tag(image_to_png_bytes(Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))),
                    "image/png")


def counted(monkeypatch) -> dict:
    """Counts of picture decodes and processor runs from here on (wrappers around the product's own)."""
    from extensions.multimodal.core import image_codec
    from extensions.multimodal.pipelines.hf_auto import transformers_pipeline

    counts = {"decoded": 0, "processed": 0}

    def wrap(module, name, count):
        original = getattr(module, name)
        original = getattr(original, "__wrapped__", original)  # a wrapper of an earlier call: wrap what it wraps

        def wrapper(*args, **kwargs):
            counts[count] += 1
            return original(*args, **kwargs)
        wrapper.__wrapped__ = original
        monkeypatch.setattr(module, name, wrapper)

    wrap(image_codec, "decode_opened", "decoded")
    wrap(transformers_pipeline, "process_images", "processed")
    return counts


def turn(embedder, prompt: str):
    """What a host does with a prompt: measure it, then embed it."""
    embedder.len_in_tokens(prompt)
    embedder.len_in_tokens(prompt)
    return embedder.forward(prompt, {"add_bos_token": True, "truncation_length": 2048, "max_new_tokens": 16})


@pytest.mark.parametrize("sizes", [[(60, 40)], [(60, 40), (30, 50)]])
def test_a_new_picture_is_decoded_and_processed_once(hf_model, monkeypatch, sizes):
    from extensions.multimodal.core.multimodal_embedder import MultimodalEmbedder

    tags = [picture_tag(w, h, seed) for seed, (w, h) in enumerate(sizes)]
    prompt = "USER: " + "".join(tags) + "\nWhat is this?\nASSISTANT:"
    results, counts = {}, {}
    for name, cache_mb in (("kept", 256), ("nothing kept", 0)):
        embedder = MultimodalEmbedder({"pipeline": "llava-hf", "embedding_cache_mb": cache_mb})
        counts[name] = counted(monkeypatch)
        results[name] = turn(embedder, prompt)
    n = len(tags)
    # kept: each picture decoded and laid out once; one picture embedded from its layout's tensors, several
    # processed together again for one batched tower call (as Hugging Face's processor takes a prompt's)
    assert counts["kept"] == {"decoded": n, "processed": n + (n > 1)}
    assert counts["nothing kept"] == {"decoded": 2 * n, "processed": n + 1}
    kept, fresh = results["kept"], results["nothing kept"]
    assert torch.equal(kept.input_ids, fresh.input_ids)
    assert torch.equal(kept.inputs_embeds, fresh.inputs_embeds)
    assert kept.image_tokens == fresh.image_tokens
