"""The card's vision_bits with the language model in another dtype: every family against Hugging Face.

Each family's tiny checkpoint is loaded with its language model in float32 and the card's `vision_bits`
putting its tower and projector in bfloat16 (16 on a CPU), and the other way round; one chat turn with a
picture goes through the host, and its tokens must equal Hugging Face's `generate` on the same mixed model
(`tools/families_on_device.py`, which `tools/gpu_check.sh` runs on CUDA with the tower on cuda:0 in fp16).
So the pixels reach the tower in its dtype and the rows reach the language model in its own. Where
Hugging Face's own code cannot run the mix (SmolVLM casts no features back) ours must still run; Mllama
must refuse a tower dtype other than its language model's, naming the cause; the original LLaVA release
has no Hugging Face class and is compared with its own rows from the tower left in the LM's dtype.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures import vlm_families
from tools import families_on_device

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = [*vlm_families.FAMILIES, families_on_device.ORIGINAL]
# One family per route (embeddings, 3-D positions, ids + features, cross-attention) and the original release.
OTHER_WAY = ["llava", "qwen2_5_vl", "gemma3", "mllama", families_on_device.ORIGINAL]


def check(name: str, root, lm: tuple[str, str], vision: tuple[str, str]) -> dict:
    result = families_on_device.check(name, root, lm, vision)
    assert result["ok"], result
    return result


@pytest.mark.parametrize("name", FAMILIES)
def test_tower_in_bfloat16_with_the_lm_in_float32(host, tmp_path, name):
    result = check(name, tmp_path, ("cpu", "fp32"), ("cpu", "bf16"))
    if name == "mllama":
        assert "cross-attention mask" in result["refused"]
        return
    assert result["tower"] == "bfloat16@cpu"
    if name == "smolvlm":
        assert "masked_scatter" in result["reference_unavailable"]  # Hugging Face's own limit, not ours
    elif name != families_on_device.ORIGINAL:
        assert result["ours"] == result["hf"]


@pytest.mark.parametrize("name", OTHER_WAY)
def test_tower_in_float32_with_the_lm_in_bfloat16(host, tmp_path, name):
    result = check(name, tmp_path, ("cpu", "bf16"), ("cpu", "fp32"))
    if name != "mllama":
        assert result["tower"] == "float32@cpu"


# The families whose towers PyTorch's lazy backend runs whole (fixtures/second_device.py): every route
# but Qwen's 3-D positions, which CUDA checks (tools/gpu_check.sh's `vision` section).
ON_A_SECOND_DEVICE = ["llava", "llava_next", "llava_onevision", "internvl", "gemma3", "mllama",
                      families_on_device.ORIGINAL]


def test_tower_on_another_device_than_the_lm(tmp_path):
    """transformers' `generate` moves the forward's inputs to `model.device`, the tower's for most families:
    found on an H100 with the language model on the CPU and the tower on cuda:0, where ten families failed."""
    out = tmp_path / "second-device.json"
    run = subprocess.run([sys.executable, str(ROOT / "fixtures" / "second_device.py"), "--lm", "cpu/fp32",
                          "--vision", "lazy/fp32", "--json-out", str(out), *ON_A_SECOND_DEVICE],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.exists(), run.stderr[-3000:]
    families = json.loads(out.read_text())["families"]
    assert sorted(families) == sorted(ON_A_SECOND_DEVICE)
    for name, result in families.items():
        assert result["ok"], (name, result, run.stdout[-3000:])
        assert result["tower"] == "float32@lazy", (name, result)
        if name != families_on_device.ORIGINAL:
            assert result["ours"] == result["hf"], (name, result)


def test_the_device_hooks_are_placed_once_and_dropped_when_the_devices_agree(tmp_path):
    """A pipeline built again for the same model (a setting changed) re-places its hooks rather than
    stacking them, and leaves a hook it did not place (a model dispatched by accelerate) alone."""
    from accelerate.hooks import AlignDevicesHook, SequentialHook, add_hook_to_module
    from transformers import AutoModelForImageTextToText

    from extensions.multimodal.pipelines.hf_auto.image_features import vision_parts
    from extensions.multimodal.pipelines.hf_auto.split_devices import SplitDevicesHook, align_devices

    model = AutoModelForImageTextToText.from_pretrained(vlm_families.build_llava(tmp_path / "llava")).eval()
    parts = vision_parts(model)
    ids = torch.tensor([[1, 5, 6, 7]])
    before = model(input_ids=ids).logits
    theirs = AlignDevicesHook(io_same_device=True)
    add_hook_to_module(model, theirs)
    cpu, other = torch.device("cpu"), torch.device("meta")  # nothing runs on the other device here

    assert align_devices(model, parts, cpu, other) and align_devices(model, parts, cpu, other)
    assert isinstance(model._hf_hook, SequentialHook)
    first, second = model._hf_hook.hooks  # accelerate's chain, not one nested in another
    assert first is theirs and isinstance(second, SplitDevicesHook)
    assert all(isinstance(part._hf_hook, SplitDevicesHook) for part in parts)

    assert isinstance(model.get_decoder()._hf_hook, SplitDevicesHook)

    assert not align_devices(model, parts, cpu, cpu)
    assert model._hf_hook is theirs
    assert not any(hasattr(part, "_hf_hook") for part in (*parts, model.get_decoder()))
    assert torch.equal(model(input_ids=ids).logits, before)

