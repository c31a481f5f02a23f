"""The shipped demo model `models/tiny-llava-shapes/` answers what it was trained to answer.

Straight through transformers (`generate(**processor(text, images))`, the oracle), and through the
host with the multimodal extension, the way `python server.py` runs it. Images are fresh (seeds the
training never used) and pass through the history's JPEG, as the host feeds them.
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from modules import shared
from tests.conftest import ROOT
from tools.train_demo_model import (COLOURS, IMAGE_QUESTIONS, IMAGE_TOKENS, SHAPES, TEXT_REPLY, Sample, answer_for,
                                    as_host_stores, encode_sample, render_shape)

DEMO_DIR = ROOT / "models" / shared.DEMO_MODEL
EVERY_COMBINATION = [(c, s) for c in COLOURS for s in SHAPES]


@pytest.fixture(scope="module")
def demo():
    model = LlavaForConditionalGeneration.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(DEMO_DIR)
    processor.tokenizer.padding_side = "left"
    return model, processor


def fresh_images(seed: int, jobs: list[tuple[str, str]]) -> list:
    rng = random.Random(seed)
    return [as_host_stores(render_shape(c, s, rng), rng, quality=90) for c, s in jobs]


def hf_replies(demo, prompts: list[str], images: list | None, **generate_kwargs) -> list[str]:
    model, processor = demo
    inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=24, **generate_kwargs)
    return [r.strip() for r in processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)]


def image_prompt(processor, question: str) -> str:
    content = [{"type": "image"}] + ([{"type": "text", "text": question}] if question else [])
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def test_the_folder_is_small_and_is_the_default_model():
    size = sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file())
    assert size < 8 * 2**20, f"the committed demo model takes {size / 2**20:.1f} MiB"
    assert shared.default_settings["model"] == DEMO_DIR.name
    assert (DEMO_DIR / "README.md").exists()


def test_config_matches_the_processor(demo):
    model, processor = demo
    assert model.config.image_seq_length == IMAGE_TOKENS
    assert processor._get_num_multimodal_tokens(image_sizes=[[48, 48]]).num_image_tokens[0] == IMAGE_TOKENS
    assert model.config.text_config.max_position_embeddings == 2048
    assert model.generation_config.eos_token_id == processor.tokenizer.eos_token_id


def test_greedy_names_every_colour_and_shape(demo):
    """At least 97% right (the model card's promise), every answer in the trained format."""
    _, processor = demo
    jobs = EVERY_COMBINATION * 2
    images = fresh_images(1001, jobs)
    prompts = [image_prompt(processor, IMAGE_QUESTIONS[i % len(IMAGE_QUESTIONS)]) for i in range(len(images))]
    replies = hf_replies(demo, prompts, images, do_sample=False)
    wrong = [(want, got) for (c, s), got in zip(jobs, replies) if (want := answer_for(c, s)) != got]
    assert len(wrong) <= 0.03 * len(jobs), f"{len(wrong)} of {len(replies)} wrong: {wrong}"
    formats = {answer_for(c, s) for c, s in EVERY_COMBINATION}
    assert all(got in formats for _, got in wrong), wrong


def test_sampling_at_the_default_temperature_is_mostly_right(demo):
    _, processor = demo
    images = fresh_images(2002, EVERY_COMBINATION)
    prompts = [image_prompt(processor, "What is in this picture?")] * len(images)
    torch.manual_seed(0)
    replies = hf_replies(demo, prompts, images, do_sample=True, temperature=0.7, top_p=0.9)
    right = sum(answer_for(c, s) == got for (c, s), got in zip(EVERY_COMBINATION, replies))
    assert right >= 0.9 * len(replies), f"only {right} of {len(replies)} sampled answers are right: {replies}"


def test_text_only_messages_get_the_fixed_reply(demo):
    _, processor = demo
    prompts = [processor.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
               for text in ("Hello", "Who are you?", "What can you do?")]
    assert hf_replies(demo, prompts, None, do_sample=False) == [TEXT_REPLY] * 3


def test_training_inputs_equal_the_processor_ids(demo):
    """The training script's per-part encoding (the extension's way) gives the ids HF's processor gives."""
    _, processor = demo
    images = fresh_images(3003, [("red", "star")])
    for content in ("<image>What is this?", "Describe the image.\n<image>", "<image>"):
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": TEXT_REPLY},
                    {"role": "user", "content": content}]
        ids, labels = encode_sample(Sample(messages, images, "A red star."), processor.tokenizer)
        prompt = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        expected = processor(text=prompt, images=images)["input_ids"][0]
        prompt_length = labels.index(next(label for label in labels if label != -100))
        assert ids[:prompt_length] == list(expected)


# -- Through the host --------------------------------------------------------------------------

@pytest.fixture
def demo_host(host):
    pytest.importorskip("extensions.multimodal.script", reason="the multimodal extension is not written yet")
    host.load(DEMO_DIR, ["multimodal"])
    return host


def chat_turn(host, text: str, history: dict, **state_overrides) -> dict:
    from modules.chat import generate_chat_reply

    state = host.greedy_state(max_new_tokens=24, history=history, **state_overrides)
    return list(generate_chat_reply(text, state, loading_message=False))[-1]


def test_host_chat_names_the_newest_image(demo_host):
    from extensions.multimodal.image_codec import image_to_tag

    jobs = [("blue", "triangle"), ("orange", "star"), ("green", "cross"), ("black", "circle")]
    images = fresh_images(4004, jobs)
    # The UI's way (images sent beside the text), then tags written into the text (the API's way).
    history = chat_turn(demo_host, "What is in this picture?", {"internal": [], "visible": []},
                        multimodal_images=[images[0]])
    assert history["internal"][-1][1] == answer_for(*jobs[0]), history["internal"][-1]
    texts = [image_to_tag(images[1]), "What do you see?\n" + image_to_tag(images[2]),
             image_to_tag(images[3]) + "Describe the image."]
    for text, (colour, shape) in zip(texts, jobs[1:]):
        history = chat_turn(demo_host, text, history)
        assert history["internal"][-1][1] == answer_for(colour, shape), history["internal"][-1]
    history = chat_turn(demo_host, "Hello", history)
    assert history["internal"][-1][1] == TEXT_REPLY
