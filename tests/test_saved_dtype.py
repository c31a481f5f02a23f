"""The dtype a folder is saved in: without flags the CPU loads it as Hugging Face's `from_pretrained` does
(a hub folder in bfloat16 gives Hugging Face's tokens, not float32's); `--cpu` loads float32."""
from __future__ import annotations

import io

import pytest
import torch
import transformers
from PIL import Image

from extensions.multimodal import loaded_model
from modules import chat, shared
from tests import vlm_families
from tests.test_vlm_families_host import NEW_TOKENS, png


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    """A Qwen2.5-VL folder saved the way the hub's are: bfloat16 weights, `dtype` in config.json."""
    path = vlm_families.build_qwen2_5_vl(tmp_path_factory.mktemp("bf16") / "qwen2_5_vl")
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def reference_reply(model, text: str, picture: bytes) -> str:
    """Greedy `generate(**processor(...))` on `model`, a model Hugging Face loaded on its own."""
    processor = loaded_model.processor()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[[Image.open(io.BytesIO(picture)).convert("RGB")]], return_tensors="pt")
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return processor.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def host_reply(text: str, picture: bytes) -> str:
    state = dict(shared.settings, max_new_tokens=NEW_TOKENS, do_sample=False, seed=0, history=chat.new_history(),
                 message_images=[picture])
    return list(chat.generate_chat_reply(text, state, loading_message=False))[-1]["internal"][-1][1]


def test_a_folder_saved_in_bf16_loads_as_hugging_face_loads_it(host, bf16_folder):
    reference = transformers.AutoModelForImageTextToText.from_pretrained(bf16_folder)  # Hugging Face's default
    assert reference.dtype == torch.bfloat16
    host.load(bf16_folder, ["multimodal"])
    assert shared.model.dtype == reference.dtype
    picture = png(64, 48, 1)
    assert host_reply("what shape is this", picture) == reference_reply(reference, "what shape is this", picture)


def test_cpu_flag_loads_float32(host, bf16_folder):
    host.load(bf16_folder, ["multimodal"], argv=["--cpu"])
    assert shared.model.dtype == torch.float32
