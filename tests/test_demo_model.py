"""The shipped demo model `models/tiny-llava-shapes/` sees, through the path users take.

Conversations go through the host with the multimodal extension, the way `python server.py` runs
it: pictures sent beside the text as the UI sends them (`state['message_images']`), stored as
`<img>` tags (lossless PNGs of the pictures), split, embedded by the llava-hf pipeline, stitched
and generated greedily.
Pictures are fresh (seeds training never used). Transformers' own `generate(**processor(...))` is
the oracle for the training script's prompt encoding and for the host's answers.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from modules import shared
from fixtures import host_helpers
from tests.conftest import ROOT
from tools.demo_model.chats import (
    COLOUR_QUESTIONS,
    COUNT_QUESTIONS,
    DESCRIBE_QUESTIONS,
    GREETING,
    IMAGE_TOKENS,
    ORDER_QUESTION,
    SHAPE_QUESTIONS,
    Sample,
    encode_sample,
    single_answers,
    single_image_turn,
    two_image_turn,
)
from tools.demo_model.eval import chat_turn, new_history
from tools.demo_model.pictures import POSITIONS, picture, random_scene

DEMO_DIR = ROOT / "models" / shared.DEMO_MODEL
pytestmark = pytest.mark.skipif(not (DEMO_DIR / "config.json").exists(),
                                reason=f"{DEMO_DIR} is absent: run python -m tools.demo_model.train")


def one_shape(colour: str, shape: str, seed: int):
    rng = random.Random(seed)
    return picture(random_scene(rng, kinds=[(colour, shape)]), rng, quality=90)


# -- The folder -------------------------------------------------------------------------------

def test_the_folder_is_small_and_is_the_default_model():
    size = sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file())
    assert size <= 15 * 2**20, f"the committed demo model takes {size / 2**20:.1f} MiB"
    assert shared.default_settings["model"] == DEMO_DIR.name
    assert (DEMO_DIR / "README.md").exists()


def test_it_loads_with_the_auto_classes_and_matches_its_processor():
    model = AutoModelForImageTextToText.from_pretrained(DEMO_DIR)
    processor = AutoProcessor.from_pretrained(DEMO_DIR)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert model.config.image_seq_length == IMAGE_TOKENS
    assert processor._get_num_multimodal_tokens(image_sizes=[[64, 64]]).num_image_tokens[0] == IMAGE_TOKENS
    assert model.generation_config.eos_token_id == processor.tokenizer.eos_token_id


def test_training_prompts_equal_the_processor_ids():
    """The training script's per-part encoding (the extension's way) gives HF's processor ids."""
    processor = AutoProcessor.from_pretrained(DEMO_DIR)
    rng = random.Random(5)
    earlier, now = single_image_turn(rng, "shape"), two_image_turn(rng, "order")
    messages = [{"role": "user", "content": earlier.user}, {"role": "assistant", "content": earlier.answer},
                {"role": "user", "content": now.user}, {"role": "assistant", "content": now.answer}]
    ids, labels = encode_sample(Sample(messages, earlier.images + now.images, [True, True], [], []),
                                processor.tokenizer)
    prompt = processor.tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    expected = list(processor(text=prompt, images=earlier.images + now.images)["input_ids"][0])
    assert ids[:len(expected)] == expected
    answer = processor.tokenizer.decode([t for t in labels[len(expected):] if t != -100], skip_special_tokens=True)
    assert answer.strip() == now.answer


# -- Through the host -------------------------------------------------------------------------

def load_demo(host, **settings):
    host.load(DEMO_DIR, ["multimodal"], settings=settings)
    from extensions.multimodal import script

    return script


@pytest.fixture
def demo(host):
    return load_demo(host)


def test_the_demo_embeds_every_image_by_default(demo):
    assert demo.params["add_all_images_to_prompt"] is True
    assert demo.served_model.embedder(demo.params).pipeline.name() == "llava-hf"


@pytest.mark.parametrize("colour, shape, seed", [("red", "circle", 11), ("blue", "square", 12),
                                                 ("yellow", "triangle", 13), ("green", "star", 14)])
def test_one_image(demo, colour, shape, seed):
    image = one_shape(colour, shape, seed)
    assert chat_turn(SHAPE_QUESTIONS[0], new_history(), [image])[0] == f"It is a {shape}."
    assert chat_turn(COLOUR_QUESTIONS[0], new_history(), [image])[0] == f"It is {colour}."
    assert chat_turn(COUNT_QUESTIONS[0], new_history(), [image])[0] == "There is one shape."
    description = chat_turn(DESCRIBE_QUESTIONS[0], new_history(), [image])[0]
    assert f"{colour} {shape}" in description, description


def test_two_shapes_in_one_image_are_counted(demo):
    rng = random.Random(21)
    image = picture(random_scene(rng, kinds=[("red", "circle"), ("blue", "square")]), rng, quality=90)
    assert chat_turn(COUNT_QUESTIONS[0], new_history(), [image])[0] == "There are two shapes."


def test_two_images_in_one_message_the_answer_follows_their_order(demo):
    red, blue = one_shape("red", "circle", 31), one_shape("blue", "square", 32)
    question = ORDER_QUESTION.format(colour="blue")
    assert chat_turn(question, new_history(), [red, blue])[0] == "The second."
    assert chat_turn(question, new_history(), [blue, red])[0] == "The first."
    assert chat_turn(ORDER_QUESTION.format(colour="red"), new_history(), [red, blue])[0] == "The first."


def test_an_earlier_image_and_a_new_one_the_answer_is_about_the_new_one(demo):
    reply, history = chat_turn(SHAPE_QUESTIONS[0], new_history(), [one_shape("orange", "star", 41)])
    assert reply == "It is a star."
    with embedded_images(demo.served_model.embedder(demo.params)) as counts:
        reply, history = chat_turn(SHAPE_QUESTIONS[0], history, [one_shape("purple", "circle", 42)])
    assert reply == "It is a circle."
    assert counts == [2]  # add_all_images_to_prompt: the old one is real too
    reply, history = chat_turn(COLOUR_QUESTIONS[0], history, [one_shape("green", "triangle", 43)])
    assert reply == "It is green."


def test_a_text_only_turn_after_an_image_turn(demo):
    reply, history = chat_turn("Hello", new_history(), [])
    assert reply == GREETING  # no picture yet: it asks for one
    _, history = chat_turn(SHAPE_QUESTIONS[0], history, [one_shape("black", "square", 51)])
    reply, history = chat_turn("Hello", history, [])
    assert reply.startswith("Hello") and "picture" in reply and "send me" not in reply.lower(), reply
    reply, _ = chat_turn(COLOUR_QUESTIONS[0], history, [one_shape("red", "triangle", 52)])
    assert reply == "It is red."


def test_follow_ups_about_the_picture_of_turn_one_are_answered_from_it(demo):
    """A picture, then text-only questions about it, chit-chat between them (as people chat): each
    answer is about that picture, and none asks for a picture now that one is in the chat."""
    rng = random.Random(61)
    scene = random_scene(rng, kinds=[("green", "triangle")])
    where = POSITIONS[scene.items[0].cell]
    turns = [("What shape is this?", "It is a triangle."), ("What color is the shape?", "It is green."),
             ("Where is the shape?", f"It is {where}."), ("Thanks", "You are welcome!"),
             ("How many shapes are there?", "There is one shape."), ("Is there a red shape?", "No."),
             ("Is there a green shape?", "Yes."), ("Describe the image.", f"A green triangle {where}.")]
    history, replies = new_history(), []
    for number, (question, _) in enumerate(turns):
        reply, history = chat_turn(question, history, [picture(scene, rng, quality=90)] if number == 0 else [])
        replies.append(reply)
    assert replies == [answer for _, answer in turns]


@contextmanager
def embedded_images(embedder):
    """The number of images each prompt embedded while the block runs (a spy on `forward`)."""
    counts, forward = [], embedder.forward

    def counting(prompt, state):
        result = forward(prompt, state)
        counts.append(result.stats.images)
        return result

    embedder.forward = counting
    try:
        yield counts
    finally:
        del embedder.forward


def newest_image_answers(script, seed: int, chats: int = 10) -> int:
    """Two-turn chats (a picture, then another); how many second answers name the newest shape."""
    rng = random.Random(seed)
    right = 0
    for _ in range(chats):
        old, new = random_scene(rng, count=1), random_scene(rng, count=1)
        _, history = chat_turn(SHAPE_QUESTIONS[0], new_history(), [picture(old, rng, quality=90)])
        with embedded_images(script.served_model.embedder(script.params)) as counts:
            reply, _ = chat_turn(SHAPE_QUESTIONS[0], history, [picture(new, rng, quality=90)])
        right += reply == single_answers(new)["shape"]
        assert counts == [2 if script.params["add_all_images_to_prompt"] else 1]
    return right


@pytest.mark.parametrize("add_all", [True, False])
def test_add_all_images_on_and_off_answers_are_about_the_newest_image(host, add_all):
    """On (the demo's default): older pictures are real features; off: placeholder rows. Either way
    the answer is about the newest picture (98.5% on 200 chats each in tools/demo_model/eval.py)."""
    script = load_demo(host, **{"multimodal-add_all_images_to_prompt": add_all})
    assert script.params["add_all_images_to_prompt"] is add_all
    assert newest_image_answers(script, 81) >= 9


def test_the_host_answers_as_transformers_does(demo):
    """Greedy replies through the host equal `generate(**processor(text, images))` on the same stored pictures."""
    from extensions.multimodal.core.image_codec import tag_b64_to_image
    from tests.multimodal_fake_pipeline import tag_payloads

    red, blue = one_shape("red", "star", 71), one_shape("blue", "circle", 72)
    reply, history = chat_turn(ORDER_QUESTION.format(colour="red"), new_history(), [blue, red])
    stored = [tag_b64_to_image(b64) for b64 in tag_payloads(history["internal"][-1][0])]
    prompt = shared.tokenizer.apply_chat_template(
        [{"role": "user", "content": ("<image>\n" * 2) + ORDER_QUESTION.format(colour="red")}],
        tokenize=False, add_generation_prompt=True)
    inputs = host_helpers.hf_processor()(text=prompt, images=stored, return_tensors="pt")
    with torch.inference_mode():
        out = shared.model.generate(**inputs, max_new_tokens=24, do_sample=False)
    expected = shared.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    assert reply == expected == "The second."


# -- The tools --------------------------------------------------------------------------------

def test_eval_script_measures_through_the_host():
    """A few fresh questions per kind; follow-ups per turn, with a count of replies that ask for a
    picture and one of the misses that the same question also misses as a chat's first; the last line
    is the JSON of accuracies."""
    result = subprocess.run([sys.executable, "-m", "tools.demo_model.eval", "--n", "12", "--kinds", "shape", "colour",
                             "count", "order", "follow-count", "follow-position", "--threads", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracies = json.loads(result.stdout.strip().splitlines()[-1])
    asking = accuracies.pop("asking_for_a_picture")
    for kind in ("count", "position"):
        missed_alone = accuracies.pop(f"follow-{kind}:missed alone")
        misses = sum(round(12 * (1 - accuracies[f"follow-{kind}@{turn}"])) for turn in (2, 3, 4))
        assert isinstance(missed_alone, int) and 0 <= missed_alone <= misses
    follow_ups = {f"follow-{kind}@{turn}" for kind in ("count", "position") for turn in (2, 3, 4)}
    assert set(accuracies) == {"shape", "colour", "count", "order"} | follow_ups
    assert all(value >= 0.8 for value in accuracies.values()), accuracies
    assert asking == 0


def test_eval_script_draws_with_the_independent_renderer():
    """`--renderer independent`: pictures from tools/demo_model/eval_pictures.py, through the same host path."""
    result = subprocess.run([sys.executable, "-m", "tools.demo_model.eval", "--renderer", "independent", "--n", "10",
                             "--kinds", "colour", "order", "yesno", "--threads", "1"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracies = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(accuracies) == {"colour", "order", "yesno"}
    assert all(value >= 0.8 for value in accuracies.values()), accuracies


def test_training_script_smoke_run_saves_a_loadable_model(tmp_path):
    from tools.demo_model import train

    out = tmp_path / "demo"
    trained = train.main(["--vision-steps", "3", "--picture-steps", "1", "--spread-steps", "2",
                          "--steps", "3", "--polish-steps", "3", "--converse-steps", "3",
                          "--vision-batch-size", "4", "--batch-size", "4",
                          "--check-n", "2", "--threads", "1", "--out", str(out)])
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    rng = random.Random(0)
    turn = single_image_turn(rng, "shape")
    prompt = processor.tokenizer.apply_chat_template([{"role": "user", "content": turn.user}], tokenize=False,
                                                     add_generation_prompt=True)
    inputs = processor(text=prompt, images=turn.images, return_tensors="pt")
    assert inputs["input_ids"].shape[1] > IMAGE_TOKENS
    with torch.inference_mode():
        assert torch.equal(model(**inputs).logits, trained(**inputs).logits)  # saved and reloaded exactly
