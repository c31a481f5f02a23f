"""Greedy tokens through the API equal Hugging Face's `generate(**processor(text, images))` on the same PNGs.

llava-hf and LLaVA-NeXT (tiny fixtures), a three-turn chat with a picture on turns 1 and 3 (every
picture embedded, as Hugging Face does): the pictures reach the model as they were sent, so the
tokens are Hugging Face's own. A different picture first changes the reference, so a path that
drops or blurs the picture cannot pass.
"""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from modules import shared
from fixtures import api_helpers, host_helpers
from tests.multimodal_fake_pipeline import encoded, noise_image

TURNS = [("<image>\nWhat is in the picture?", 0), ("And the colour?", None), ("<image>\nAnd this one?", 1)]


def hf_reply(messages: list[dict], pictures: list[bytes], max_new_tokens: int) -> str:
    processor = host_helpers.hf_processor()  # transformers' own, not the host's tokenizer
    prompt = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
    inputs = processor(text=prompt, images=images, return_tensors="pt")
    with torch.inference_mode():
        output = shared.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                       pad_token_id=processor.tokenizer.pad_token_id)
    return processor.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).lstrip(" ")


def api_message(text: str, picture: bytes | None) -> dict:
    if picture is None:
        return {"role": "user", "content": text}
    text = text.removeprefix("<image>\n")
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": api_helpers.data_url(picture)}},
                                        {"type": "text", "text": text}]}


@pytest.mark.parametrize("fixture", ["llava_dir", "llava_next_dir"])
def test_api_tokens_equal_hugging_face_generate_on_the_same_pngs(request, fixture):
    pictures = [encoded(noise_image(seed, size), "PNG") for seed, size in ((11, (48, 30)), (12, (30, 44)))]
    with api_helpers.serving(request.getfixturevalue(fixture), ["multimodal"],
                             settings={"multimodal-add_all_images_to_prompt": True}) as api:
        assert hf_reply([{"role": "user", "content": TURNS[0][0]}], pictures[:1], 8) != \
            hf_reply([{"role": "user", "content": TURNS[0][0]}], pictures[1:], 8), "the picture matters"
        messages, hf_messages, sent = [], [], []
        for text, index in TURNS:
            picture = pictures[index] if index is not None else None
            sent += [picture] if picture else []
            messages.append(api_message(text, picture))
            hf_messages.append({"role": "user", "content": text})
            reply = api.client().chat.completions.create(model="any", messages=messages, max_tokens=8,
                                                         temperature=0).choices[0].message.content
            assert reply == hf_reply(hf_messages, sent, 8), text
            messages.append({"role": "assistant", "content": reply})
            hf_messages.append({"role": "assistant", "content": reply})
