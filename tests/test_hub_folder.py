"""Folders laid out as the hub's are, through `/v1/chat/completions` on one server, against Hugging Face's
own `from_pretrained` (defaults: the saved dtype, the folder's generation config).

Each folder: bfloat16 weights (`dtype` in config.json) and a generation config as Qwen2.5-VL's on the
hub: pad and EOS ids that occur in every prompt's template, and its sampling defaults, among them
`repetition_penalty` 1.05, which Hugging Face's greedy `generate` applies to the prompt's ids too. The
host never takes a checkpoint's sampler values (text-generation-webui's rule), so the requests ask for
that penalty themselves.
The Qwen2.5-VL folder also has the older `"type": "mrope"` rope key beside `rope_type`, and a
template that writes Qwen's default system message. One family per route: embeddings with 3-D
positions (Qwen2.5-VL), embeddings (LLaVA-OneVision), ids with features (Gemma 3).
Without flags the CPU loads a folder in the dtype it is saved in, as Hugging Face does (it used to
load float32); `--cpu` loads float32.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from modules import shared
from fixtures import api_helpers, vlm_families
from tests.test_prefix_cache_sliding import ask, user
from tests.test_vlm_families_host import hf_reply, png

QWEN_GENERATION = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.1, "top_k": 1, "top_p": 0.001}


def build(path: Path, family: str, family_folder) -> Path:
    if family == "qwen2_5_vl":
        return vlm_families.build_qwen(path, 0, "Qwen2_5_VL", dict(hidden_size=32, intermediate_size=64, window_size=32,
                                                                    out_hidden_size=64, fullatt_block_indexes=[1]),
                                       rope={"type": "mrope", "rope_theta": 1000000.0})
    # A copy of the session's shared folder (tests/conftest.py): `make` re-saves it in bfloat16.
    return Path(shutil.copytree(family_folder(family), path))


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory, family_folder):
    def make(family: str):
        path = build(tmp_path_factory.mktemp("hub") / family, family, family_folder)
        model = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model.generation_config.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                       **QWEN_GENERATION)
        model.to(torch.bfloat16).save_pretrained(path)
        assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
        return path
    return functools.cache(make)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision", "gemma3"])
def test_a_hub_folder_through_the_api_equals_hugging_face_as_it_loads_it(hub_folder, family):
    reference = transformers.AutoModelForImageTextToText.from_pretrained(hub_folder(family))
    assert reference.dtype == torch.bfloat16
    picture = png(64, 48, 1)
    with api_helpers.serving(hub_folder(family), ["multimodal"]) as api:
        assert shared.model.dtype == reference.dtype
        messages, turns = [], []
        for text, pictures in [("what shape is this", [picture]), ("and the colour?", []), ("and now?", [])]:
            messages.append(user(text, pictures))
            turns.append((text, pictures, None))
            reply = ask(api, messages, repetition_penalty=QWEN_GENERATION["repetition_penalty"])
            assert reply == hf_reply(turns, reference), text
            messages.append({"role": "assistant", "content": reply})
            turns[-1] = (text, pictures, reply)
        first = hf_reply([("what shape is this", [picture], None)], reference)
        others = [hf_reply([("what shape is this", [png(64, 48, seed)], None)], reference)
                  for seed in (2, 3, 4)]
        assert any(other != first for other in others), "no other picture changes the reference reply"


def test_cpu_flag_loads_float32(host, hub_folder):
    host.load(hub_folder("qwen2_5_vl"), ["multimodal"], argv=["--cpu"])
    assert shared.model.dtype == torch.float32
