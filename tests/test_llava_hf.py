"""The `llava-hf` pipeline (the `transformers` pipeline for LLaVA / LLaVA-NeXT) against Hugging Face's own forward.

Differential: the processor's input ids with our embeddings placed at the image tokens must give
the logits that `model(**processor(text, images))` gives.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from PIL import Image

from modules import shared
from fixtures import host_helpers

PROMPT_2 = "USER: <image>\nWhat is this? And <image> this?\nASSISTANT:"


@pytest.fixture(scope="module")
def llava_hf_dir(llava_dir):
    return llava_dir


@pytest.fixture(scope="module")
def llava_next_hf_dir(llava_next_dir):
    return llava_next_dir


@pytest.fixture(params=["llava", "llava_next"])
def hf_model(request, host, llava_hf_dir, llava_next_hf_dir):
    host.load(llava_hf_dir if request.param == "llava" else llava_next_hf_dir)
    return request.param


def random_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def pipeline(params=None):
    from extensions.multimodal.pipelines.hf_auto import pipelines

    return pipelines.get_pipeline("llava-hf", params or {})


def our_logits(pipe, input_ids: torch.Tensor, images) -> torch.Tensor:
    """The processor's ids, embedded by the pipeline, with its image features at the image tokens."""
    embeds = pipe.embed_tokens(input_ids[0]).clone()
    features = torch.cat(pipe.embed_images(images))
    mask = input_ids[0] == pipe.placeholder_token_id()
    assert int(mask.sum()) == features.shape[0]
    embeds[mask] = features
    with torch.no_grad():
        return shared.model(inputs_embeds=embeds[None]).logits


def test_picked_from_the_loaded_model(hf_model):
    from extensions.multimodal.pipelines.hf_auto import pipelines

    # The folder name says nothing certain; the loaded model's type does.
    picked = pipelines.get_pipeline_from_model_name("some-folder", {})
    assert picked is not None and picked.name() == "llava-hf"
    assert picked.placeholder_token_id() == shared.tokenizer.convert_tokens_to_ids("<image>")
    assert (picked.image_start(), picked.image_end()) == ("", "")
    # no second copy of the tower: the pipeline holds the host's model and nothing else with weights
    assert picked.model is shared.model
    assert not [v for v in vars(picked).values() if isinstance(v, torch.nn.Module) and v is not shared.model]


@pytest.mark.parametrize("images", [[(32, 32)], [(40, 24), (24, 56)], [(64, 64), (20, 20)]])
def test_embeddings_reproduce_hf_forward(hf_model, images):
    images = [random_image(w, h, seed) for seed, (w, h) in enumerate(images)]
    prompt = PROMPT_2 if len(images) == 2 else "USER: <image>\nWhat is this?\nASSISTANT:"
    inputs = host_helpers.hf_processor()(text=prompt, images=images, return_tensors="pt")
    with torch.no_grad():
        expected = shared.model(**inputs).logits
    torch.testing.assert_close(our_logits(pipeline(), inputs["input_ids"], images), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("size", [(32, 32), (40, 20), (20, 64), (64, 64), (100, 30)])
def test_token_count_per_image_matches_the_processor(hf_model, size):
    image = random_image(*size, seed=0)
    pipe = pipeline()
    ids = host_helpers.hf_processor()(text="<image>", images=[image], return_tensors="pt")["input_ids"][0]
    layout = pipe.image_layout(image).ids
    assert torch.equal(layout, ids[ids == pipe.placeholder_token_id()]), "the processor's own ids for the image"
    assert pipe.embed_images([image])[0].shape[0] == layout.numel()
    if hf_model == "llava":
        assert pipe.num_image_embeds() == layout.numel() == 16


def test_next_counts_depend_on_the_image_size(host, llava_next_hf_dir):
    host.load(llava_next_hf_dir)
    pipe = pipeline()
    images = [random_image(40, 20, 0), random_image(20, 64, 1)]
    counts = [pipe.image_layout(image).ids.numel() for image in images]
    assert counts[0] != counts[1]
    features = torch.cat(pipe.embed_images(images))
    assert features.shape == (sum(counts), shared.model.config.text_config.hidden_size)
    one_by_one = torch.cat([pipe.embed_images([image])[0] for image in images])
    torch.testing.assert_close(features, one_by_one, atol=1e-5, rtol=1e-5)


def test_vision_bits_cast_the_tower(hf_model):
    images = [random_image(40, 24, 0)]
    full = pipeline().embed_images(images)[0]
    inner = shared.model.model

    def tower_bytes() -> int:
        return sum(p.numel() * p.element_size() for part in (inner.vision_tower, inner.multi_modal_projector)
                   for p in part.parameters())

    fp32_bytes = tower_bytes()
    half = pipeline({"vision_bits": 16, "vision_device": "cpu"})  # 16 on the CPU: bfloat16
    assert tower_bytes() * 2 == fp32_bytes, "vision_bits 16 halves the tower's memory"
    assert {p.dtype for p in inner.vision_tower.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in inner.multi_modal_projector.parameters()} == {torch.bfloat16}
    assert shared.model.get_input_embeddings().weight.dtype == torch.float32  # the LM is untouched
    embeds = half.embed_images(images)[0]
    assert embeds.dtype == torch.float32
    assert (embeds - full).abs().max() < 0.06 * full.abs().max()
    assert half.cache_key() != pipeline({"vision_bits": 32}).cache_key()


def test_needs_a_llava_model(host, llama_dir):
    host.load(llama_dir)
    with pytest.raises(ValueError, match="serves llava, llava_next models; the loaded model is LlamaForCausalLM"):
        pipeline()
