"""`--bf16` on the CPU: the language model, vision tower and projector in bfloat16, images embedded in it,
and the host's tokens equal to Hugging Face's `generate` in bfloat16 on the same model."""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from modules import chat, shared
from tests.test_vlm_families_host import NEW_TOKENS, hf_reply, png


@pytest.mark.parametrize("name", ["llava", "qwen2_5_vl", "gemma3"])
def test_bf16_end_to_end_equals_hugging_face_in_bf16(host, family_folder, name):
    host.load(family_folder(name), ["multimodal"], argv=["--bf16"])
    from extensions.multimodal import script

    inner = shared.model.model
    tower = next(getattr(inner, n) for n in ("vision_tower", "visual", "vision_model") if hasattr(inner, n))
    assert shared.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert {p.dtype for p in tower.parameters()} == {torch.bfloat16}
    picture = png(64, 48, 21)
    assert script.served_model.embedder(script.params).pipeline.embed_images([Image.open(io.BytesIO(picture))])[0].dtype == torch.bfloat16
    state = dict(shared.settings, max_new_tokens=NEW_TOKENS, do_sample=False, seed=0, history=chat.new_history(),
                 message_images=[picture])
    latest = list(chat.generate_chat_reply("What is in the picture?", state, loading_message=False))[-1]
    assert latest["internal"][-1][1] == hf_reply([("What is in the picture?", [picture], None)])
