"""Original-LLaVA pipelines (CLIP tower + mm_projector) against a reference computed directly.

The reference is LLaVA's own recipe written out by hand: pad to a square with the processor's mean
colour (v1.5), CLIP hidden state -2 without the CLS position, then the projector's layers as plain
`F.linear` / `F.gelu` on the tensors read from the checkpoint.
"""
from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import CLIPImageProcessorPil, CLIPVisionModel

from modules import shared

PREFIX = "model.mm_projector."


def llava_pipelines():
    from extensions.multimodal.pipelines.llava import pipelines

    return pipelines


def random_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


IMAGES = [random_image(40, 24, 1), random_image(24, 40, 2), random_image(32, 32, 3)]


def expand2square(pil_img, background_color):
    """Copied from LLaVA (llava/mm_utils.py)."""
    width, height = pil_img.size
    if width == height:
        return pil_img
    elif width > height:
        result = Image.new(pil_img.mode, (width, width), background_color)
        result.paste(pil_img, (0, (width - height) // 2))
        return result
    else:
        result = Image.new(pil_img.mode, (height, height), background_color)
        result.paste(pil_img, ((height - width) // 2, 0))
        return result


def clip_features(clip_dir: Path, images, pad: bool) -> torch.Tensor:
    processor = CLIPImageProcessorPil.from_pretrained(clip_dir)
    if pad:
        images = [expand2square(im, tuple(int(x * 255) for x in processor.image_mean)) for im in images]
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        hidden = CLIPVisionModel.from_pretrained(clip_dir).eval()(pixels, output_hidden_states=True).hidden_states
    return hidden[-2][:, 1:]


def projector_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k.startswith(PREFIX)}


def reference_v15(model_dir: Path, clip_dir: Path, images) -> torch.Tensor:
    w = projector_tensors(model_dir)
    x = F.linear(clip_features(clip_dir, images, pad=True), w[PREFIX + "0.weight"], w[PREFIX + "0.bias"])
    return F.linear(F.gelu(x), w[PREFIX + "2.weight"], w[PREFIX + "2.bias"])


@pytest.fixture
def original(host, llava_original_dirs):
    model_dir, clip_dir = llava_original_dirs
    host.load(model_dir)
    return model_dir, clip_dir


def test_v15_embeddings_equal_the_reference(original):
    model_dir, clip_dir = original
    # Picked from the folder name; the tower comes from the checkpoint's own mm_vision_tower folder.
    pipeline = llava_pipelines().get_pipeline_from_model_name(shared.model_name.lower(), {})
    assert pipeline.name() == "llava-v1.5-7b"
    assert pipeline.num_image_embeds() == 16 and pipeline.image_start() == "" and pipeline.image_end() == ""
    assert pipeline.placeholder_token_id() == 0
    embeds = pipeline.embed_images(IMAGES)
    assert embeds.shape == (3, 16, shared.model.config.hidden_size)
    torch.testing.assert_close(embeds, reference_v15(model_dir, clip_dir, IMAGES), atol=1e-5, rtol=1e-5)
    # padding matters for non-square images: the centre-cropped path would differ
    w = projector_tensors(model_dir)
    cropped = F.linear(F.gelu(F.linear(clip_features(clip_dir, IMAGES[:1], pad=False), w[PREFIX + "0.weight"],
                                       w[PREFIX + "0.bias"])), w[PREFIX + "2.weight"], w[PREFIX + "2.bias"])
    assert not torch.allclose(embeds[:1], cropped, atol=1e-3)


def test_one_batched_vision_forward(original):
    pipeline = llava_pipelines().get_pipeline("llava-v1.5-7b", {})
    calls = []
    pipeline.vision_tower.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    pipeline.embed_images(IMAGES)
    assert calls == [3]


@pytest.mark.parametrize("bits", [16, "bf16"])
def test_sixteen_bit_weights_run_and_stay_close(original, bits):
    full = llava_pipelines().get_pipeline("llava-v1.5-7b", {}).embed_images(IMAGES)
    half = llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_bits": bits, "projector_bits": bits,
                                                             "vision_device": "cpu", "projector_device": "cpu"})
    dtype = torch.bfloat16  # 16 on the CPU means bfloat16: a CPU has no fast float16
    assert {p.dtype for p in half.vision_tower.parameters()} == {dtype}
    assert {p.dtype for p in half.projector.parameters()} == {dtype}
    assert {p.device.type for p in half.projector.parameters()} == {"cpu"}
    embeds = half.embed_images(IMAGES)
    assert embeds.dtype == shared.model.dtype  # handed to the LM in its own dtype
    assert (embeds - full).abs().max() < 0.06 * full.abs().max()


@pytest.mark.parametrize("suffix", [".bin", ".safetensors"])
def test_projector_given_by_path(host, llama_dir, llava_original_dirs, tmp_path, suffix):
    model_dir, clip_dir = llava_original_dirs
    host.load(llama_dir)  # a plain Llama folder: no projector, no mm_vision_tower
    path = tmp_path / f"mm_projector{suffix}"
    tensors = projector_tensors(model_dir)
    if suffix == ".bin":
        torch.save(tensors, path)
    else:
        save_file(tensors, str(path))
    pipeline = llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_tower": str(clip_dir), "projector_path": str(path)})
    torch.testing.assert_close(pipeline.embed_images(IMAGES[:2]), reference_v15(model_dir, clip_dir, IMAGES[:2]),
                               atol=1e-5, rtol=1e-5)


def test_projector_in_bin_shards_of_the_model_folder(host, llava_original_dirs, tmp_path):
    model_dir, clip_dir = llava_original_dirs
    copy = tmp_path / "llava-v1.5-7b-bin"
    shutil.copytree(model_dir, copy)
    weights = load_file(str(copy / "model.safetensors"))
    (copy / "model.safetensors").unlink()
    torch.save(weights, copy / "pytorch_model.bin")
    host.load(copy)
    pipeline = llava_pipelines().get_pipeline("llava-v1.5-7b", {})
    torch.testing.assert_close(pipeline.embed_images(IMAGES[:1]), reference_v15(model_dir, clip_dir, IMAGES[:1]),
                               atol=1e-5, rtol=1e-5)


def test_missing_projector_names_what_and_where(host, llama_dir, llava_original_dirs):
    _, clip_dir = llava_original_dirs
    host.load(llama_dir)
    from extensions.multimodal.pipelines.llava.weights import MissingWeightsError

    with pytest.raises(MissingWeightsError) as error:  # HF_HUB_OFFLINE=1 (conftest): the hub is not reached
        llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_tower": str(clip_dir)})
    message = str(error.value)
    for expected in ["mm_projector", str(llama_dir), "liuhaotian/llava-v1.5-7b/mm_projector.bin", "projector_path"]:
        assert expected in message
    with pytest.raises(MissingWeightsError, match="not a file"):
        llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_tower": str(clip_dir),
                                                         "projector_path": str(llama_dir / "nope.bin")})
    with pytest.raises(MissingWeightsError, match="holds no 'model.mm_projector"):
        llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_tower": str(clip_dir),
                                                         "projector_path": str(llama_dir / "model.safetensors")})


def test_missing_vision_tower_names_what_and_where(host, llama_dir, tmp_path):
    host.load(llama_dir)
    from extensions.multimodal.pipelines.llava.weights import MissingWeightsError

    with pytest.raises(MissingWeightsError) as error:
        llava_pipelines().get_pipeline("llava-v1.5-7b", {})
    assert "openai/clip-vit-large-patch14-336" in str(error.value) and "vision_tower" in str(error.value)
    with pytest.raises(MissingWeightsError, match="is not a folder"):
        llava_pipelines().get_pipeline("llava-v1.5-7b", {"vision_tower": str(tmp_path / "no-clip")})


def test_wrong_release_for_the_weights_is_named(original):
    with pytest.raises(ValueError, match=r"'llava-7b' pipeline \(linear\) expects \['bias', 'weight'\]"):
        llava_pipelines().get_pipeline("llava-7b", {})


def linear_projector(path: Path, out_width: int, seed: int = 5) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    tensors = {PREFIX + "weight": torch.randn(out_width, 32) * 0.1, PREFIX + "bias": torch.randn(out_width) * 0.1}
    torch.save(tensors, path)
    return tensors


def test_v0_release_crops_and_uses_markers(original, tmp_path):
    _, clip_dir = original
    tensors = linear_projector(tmp_path / "mm_projector.bin", shared.model.config.hidden_size)
    pipeline = llava_pipelines().get_pipeline("llava-7b", {"projector_path": str(tmp_path / "mm_projector.bin")})
    assert (pipeline.image_start(), pipeline.image_end()) == ("<im_start>", "<im_end>")
    # the loaded tokenizer's own <im_patch> id
    assert pipeline.placeholder_token_id() == shared.tokenizer.convert_tokens_to_ids("<im_patch>")
    expected = F.linear(clip_features(clip_dir, IMAGES, pad=False), tensors[PREFIX + "weight"], tensors[PREFIX + "bias"])
    torch.testing.assert_close(pipeline.embed_images(IMAGES), expected, atol=1e-5, rtol=1e-5)
    placeholders = pipeline.placeholder_embeddings()
    assert placeholders.shape == (16, shared.model.config.hidden_size)
    torch.testing.assert_close(placeholders[3], shared.model.get_input_embeddings().weight[pipeline.placeholder_token_id()])


def test_projector_width_must_match_the_model(original, tmp_path):
    linear_projector(tmp_path / "mm_projector.bin", shared.model.config.hidden_size + 16)
    with pytest.raises(ValueError, match="gives 80-wide embeddings .*4096.*loaded model's are 64"):
        llava_pipelines().get_pipeline("llava-7b", {"projector_path": str(tmp_path / "mm_projector.bin")})


def test_cache_key_changes_with_dtype(original):
    pipelines = llava_pipelines()
    assert pipelines.get_pipeline("llava-v1.5-7b", {}).cache_key() != \
        pipelines.get_pipeline("llava-v1.5-7b", {"vision_bits": 16}).cache_key()


@pytest.mark.parametrize("name, expected", [
    ("llava-v1.5-13b", "llava-v1.5-13b"),
    ("liuhaotian_llava-v1.5-7b", "llava-v1.5-7b"),
    ("llava-1.5-13b-4bit", "llava-v1.5-13b"),
    ("llava-7b", "llava-7b"),
    ("llava-13b-delta-v0", "llava-13b"),
    ("llava-llama-2-13b-chat-lightning-preview", "llava-llama-2-13b"),
    ("llava-llama-2-7b-chat", None),  # no such built-in release
    ("llava-v1.6-vicuna-7b", None),
    ("llava-next-13b", None),
    ("llava-1.5-7b-hf", None),  # the HF format: llava-hf, picked from the loaded model instead
    ("llava-v1.5", None),  # no size
    ("llava-17b", None),
    ("vicuna-7b-v1.5", None),
])
def test_original_release_from_model_name(name, expected):
    assert llava_pipelines().pipeline_name_for(name) == expected


def test_registry():
    pipelines = llava_pipelines()
    assert pipelines.available_pipelines == ["llava-7b", "llava-13b", "llava-llama-2-13b", "llava-v1.5-7b",
                                             "llava-v1.5-13b"]
    assert pipelines.get_pipeline("minigpt4-13b", {}) is None


def test_no_pick_for_a_plain_llama(host, llama_dir):
    host.load(llama_dir)
    assert llava_pipelines().get_pipeline_from_model_name("tiny-llama", {}) is None


def test_served_through_the_extension(host, llava_original_dirs):
    """No --multimodal-pipeline: picked from the folder name; the image rows are the reference's."""
    from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, store_image, tag_b64_to_image
    from modules.extensions import apply_extensions
    from modules.text_generation import encode, generate_reply

    model_dir, clip_dir = llava_original_dirs
    host.load(model_dir, ["multimodal"])
    script = importlib.import_module("extensions.multimodal.script")
    assert script.served_model.current_embedder() is not None and script.served_model.current_embedder().pipeline.name() == "llava-v1.5-7b"
    tag = store_image(IMAGES[0]).tag
    decoded = tag_b64_to_image(IMAGE_TAG_RE.search(tag).group("data"))
    prompt = f"USER: {tag}\nWhat is this?\nASSISTANT:"
    state = host.greedy_state(max_new_tokens=4, ban_eos_token=True)
    _, ids, embeds = apply_extensions("tokenizer", state, prompt, encode(prompt), None)
    image_rows = ids[0] == 0  # LLaVA-1.5's placeholder: <unk>
    assert int(image_rows.sum()) == 16
    torch.testing.assert_close(embeds[0, image_rows], reference_v15(model_dir, clip_dir, [decoded])[0],
                               atol=1e-5, rtol=1e-5)
    assert list(generate_reply(prompt, state))[-1]
    assert state["generation_stats"]["prompt_tokens"] == ids.shape[1]


def fake_hub_repo(hub: Path, repo_id: str, files: dict[str, Path]) -> None:
    """An offline hub cache entry (`models--org--name/{refs/main, snapshots/<sha>/...}`), as a download leaves it."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, source in files.items():
        shutil.copy2(source, snapshot / name)


@pytest.mark.parametrize("name", ["llava-7b", "llava-13b", "llava-llama-2-13b", "llava-v1.5-7b", "llava-v1.5-13b"])
def test_every_release_fetches_its_tower_and_projector_through_the_hub_cache(host, llama_dir, llava_original_dirs,
                                                                              tmp_path, monkeypatch, name):
    """A plain Llama folder (no projector, no tower path): both come from the release's hub repos, offline."""
    import huggingface_hub.constants
    from extensions.multimodal.pipelines.llava.specs import get_spec

    spec = get_spec(name)
    _, clip_dir = llava_original_dirs
    hub = tmp_path / "hub"
    fake_hub_repo(hub, spec.vision_repo, {p.name: p for p in clip_dir.iterdir() if p.is_file()})
    width, vision = 64, CLIPVisionModel.from_pretrained(clip_dir).config.hidden_size
    if spec.projector_type == "linear":
        layers = {"weight": torch.randn(width, vision), "bias": torch.randn(width)}
    else:
        layers = {"0.weight": torch.randn(width, vision), "0.bias": torch.randn(width),
                  "2.weight": torch.randn(width, width), "2.bias": torch.randn(width)}
    torch.save({PREFIX + k: v.half() for k, v in layers.items()}, tmp_path / spec.projector_filename)  # fp16, as released
    fake_hub_repo(hub, spec.projector_repo, {spec.projector_filename: tmp_path / spec.projector_filename})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    host.load(llama_dir)
    pipeline = llava_pipelines().get_pipeline(name, {})
    assert pipeline.vision_source == spec.vision_repo
    assert pipeline.projector_source == f"{spec.projector_repo}/{spec.projector_filename}"
    rows = pipeline.embed_images(IMAGES[:2])
    assert rows.shape == (2, pipeline.num_image_embeds(), width) and not torch.equal(rows[0], rows[1])
