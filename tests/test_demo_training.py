"""The demo model's training data and training script (tools/demo_model/pictures.py, tools/demo_model/train.py).

- Every shape lies in the cell of the **whole picture** that its answer names, on canvases of any
  size and aspect ratio (only a large lone shape in the centre may spill over), and the per-patch
  labels put it in the same cell of the processor's square; the picture labels list its shapes in
  reading order.
- The processor crops nothing: a mark at a picture's very edge reaches the model's pixels.
- Training is reproducible bit for bit from its seed (two short runs, byte-identical weights), also
  when a run is split with `--resume`; stages 3 and 4 tune the tower that stage 2 keeps frozen.
- The language model gets the CLS row and every patch row; stage 1's probes ask for what each
  phase is meant to teach (the CLS heads late and ramped, every row in the spread phase).
- Stage 4's conversations: several text-only follow-ups about the newest picture, every kind at every
  turn, answered from that picture; a reply asks for a picture only before the first one.
"""
from __future__ import annotations

import hashlib
import random
import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LlavaForConditionalGeneration

from tools.demo_model.pictures import (
    COLOURS, CENTER, CELL_HALF, POSITIONS, SHAPES, draw_scene, patch_labels, picture, random_scene, scene_labels,
)
from tools.demo_model.architecture import (
    GRID, build_model, build_processor, build_tokenizer, image_features, vision_parameters,
)
from tools.demo_model.chats import IMAGE_MARK, IMAGE_TOKENS, PRESENCE_QUESTIONS, QUESTIONS_OF, TEXT_CHAT
from tools.demo_model.conversations import conversation_sample
from tools.demo_model.vision_stage import VisionProbe, picture_weight, presence, probe_targets
from tools.demo_model.train import main as train


def shape_pixels(image) -> np.ndarray:
    """(y, x) of pixels no light background has: some channel below 110."""
    return np.argwhere(np.asarray(image).min(axis=2) < 110)


def in_cell(scene) -> bool:
    item = scene.items[0]
    return not (item.cell == CENTER and item.r > CELL_HALF)


@pytest.mark.parametrize("seed", range(40))
def test_a_lone_shape_lies_in_the_cell_of_the_whole_picture_its_answer_names(seed):
    rng = random.Random(seed)
    scene = random_scene(rng, count=1)
    image = draw_scene(scene, rng)
    width, height = image.size
    assert (width, height) == scene.size and max(width, height) / min(width, height) <= 1.83
    ys, xs = shape_pixels(image).T
    assert len(ys) > 0, "the shape is visible"
    row, col = divmod(scene.items[0].cell, 3)
    if in_cell(scene):
        assert row * height / 3 - 1 <= ys.min() and ys.max() < (row + 1) * height / 3 + 1, (scene, image.size)
        assert col * width / 3 - 1 <= xs.min() and xs.max() < (col + 1) * width / 3 + 1, (scene, image.size)
    else:  # a large lone shape is centred on the picture's centre
        assert abs(xs.mean() / width - 0.5) < 0.12 and abs(ys.mean() / height - 0.5) < 0.12


@pytest.mark.parametrize("seed", range(20))
def test_patch_labels_put_each_shape_in_its_cell_of_the_squashed_picture(seed):
    rng = random.Random(500 + seed)
    scene = random_scene(rng, count=2)
    _, _, cells = patch_labels(scene, GRID)
    grid_cells = np.array([(row * 3 // GRID) * 3 + col * 3 // GRID for row in range(GRID) for col in range(GRID)])
    for item in scene.items:
        patches = np.flatnonzero(cells == item.cell)
        assert len(patches) > 0, f"{item} covers a fifth of some patch"
        # a patch straddling a cell border may lie half in the next cell
        assert np.isin(grid_cells[patches], neighbours(item.cell)).all()


@pytest.mark.parametrize("count", (1, 2))
def test_picture_labels_list_the_shapes_in_reading_order(count):
    scene = random_scene(random.Random(count), count=count)
    labels = scene_labels(scene).reshape(2, 3)
    for slot, item in enumerate(scene.items):
        assert tuple(labels[slot]) == (list(COLOURS).index(item.colour), SHAPES.index(item.shape), item.cell)
    assert (labels[count:] == -1).all()
    assert sorted(item.cell for item in scene.items) == [item.cell for item in scene.items]


def neighbours(cell: int) -> list[int]:
    row, col = divmod(cell, 3)
    return [r * 3 + c for r in range(max(0, row - 1), min(3, row + 2)) for c in range(max(0, col - 1), min(3, col + 2))]


def test_the_processor_keeps_the_whole_picture():
    processor = build_processor(build_tokenizer()).image_processor
    picture = Image.new("RGB", (300, 120), (255, 255, 255))
    picture.paste((255, 0, 0), (0, 0, 6, 120))  # a red strip on the left edge: a centre crop drops it
    pixels = processor(picture, return_tensors="np")["pixel_values"][0]  # (3, side, side), normalised
    assert pixels.shape[1] == pixels.shape[2]
    red_minus_green = pixels[0] - pixels[1]
    assert red_minus_green[:, 0].min() > 1.0 and abs(red_minus_green[:, -1]).max() < 0.2


TINY_RUN = ["--vision-steps", "3", "--picture-steps", "1", "--spread-steps", "2", "--steps", "2",
            "--polish-steps", "2", "--converse-steps", "2", "--vision-batch-size", "4", "--batch-size", "2",
            "--check-n", "1", "--threads", "2"]


def test_training_is_reproducible_bit_for_bit(tmp_path):
    # stage 1 both without and with the picture heads, its pictures drawn by the worker process, then
    # the spread phase (every row names what its picture holds)
    digests = []
    for run in ("a", "b"):
        train(TINY_RUN + ["--out", str(tmp_path / run)])
        digests.append(hashlib.sha256((tmp_path / run / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_the_resume_chain_gives_the_bytes_of_one_run(tmp_path):
    """Stage 1, then `--resume-at spread`, `--resume` (stage 2), `--resume-at polish` and
    `--resume-at converse` (how long runs are split) == one run."""
    train(TINY_RUN + ["--out", str(tmp_path / "whole")])
    no_more = ["--steps", "0", "--polish-steps", "0", "--converse-steps", "0"]
    train(TINY_RUN + ["--spread-steps", "0", *no_more, "--out", str(tmp_path / "tower")])
    train(TINY_RUN + ["--resume", str(tmp_path / "tower"), "--resume-at", "spread", *no_more,
                      "--out", str(tmp_path / "spread")])
    train(TINY_RUN + ["--resume", str(tmp_path / "spread"), "--polish-steps", "0", "--converse-steps", "0",
                      "--out", str(tmp_path / "chat")])
    train(TINY_RUN + ["--resume", str(tmp_path / "chat"), "--resume-at", "polish", "--converse-steps", "0",
                      "--out", str(tmp_path / "polish")])
    train(TINY_RUN + ["--resume", str(tmp_path / "polish"), "--resume-at", "converse",
                      "--out", str(tmp_path / "chained")])
    runs = ("whole", "chained", "tower", "chat", "polish")
    weights = {run: (tmp_path / run / "model.safetensors").read_bytes() for run in runs}
    assert weights["whole"] == weights["chained"]
    assert weights["whole"] not in (weights["tower"], weights["chat"], weights["polish"])


@pytest.mark.parametrize("rate_flag, skipped", [("--polish-tower-lr", "--converse-steps"),
                                                 ("--converse-tower-lr", "--polish-steps")])
def test_stages_3_and_4_tune_the_tower_that_stage_2_keeps(tmp_path, rate_flag, skipped):
    """Stage 2 trains the language model on a frozen tower; stage 3 (and stage 4, each run here alone
    after stage 2) trains both, the tower at its own rate, or not at all with rate 0."""
    train(TINY_RUN + ["--polish-steps", "0", "--converse-steps", "0", "--out", str(tmp_path / "chat")])
    for run, rate in (("tuned", "1e-3"), ("kept", "0")):
        train(TINY_RUN + ["--resume", str(tmp_path / "chat"), "--resume-at", "polish", rate_flag, rate,
                          skipped, "0", "--out", str(tmp_path / run)])
    flat = lambda params: torch.cat([p.flatten() for p in params])
    models = {run: LlavaForConditionalGeneration.from_pretrained(tmp_path / run) for run in ("chat", "tuned", "kept")}
    tower = {run: flat(vision_parameters(model)) for run, model in models.items()}
    head = {run: flat(model.lm_head.parameters()) for run, model in models.items()}
    assert torch.equal(tower["chat"], tower["kept"]) and not torch.equal(tower["chat"], tower["tuned"])
    assert not torch.equal(head["chat"], head["kept"])


def test_the_cls_probe_joins_late_and_ramps_up():
    """Stage 1's whole-picture probe is off before its last steps, then rises to full weight."""
    weights = [picture_weight(step, steps=100, picture_steps=40, ramp=10) for step in range(100)]
    assert weights[:60] == [0.0] * 60
    assert weights[60] == 0.1 and weights[64] == 0.5 and weights[69:] == [1.0] * 31
    assert all(a <= b for a, b in zip(weights, weights[1:]))


def test_the_language_model_gets_the_cls_row_then_every_patch_row():
    """The rows the training probes shape are the rows the processor makes room for, CLS first."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    pixels = build_processor(tokenizer).image_processor(Image.new("RGB", (90, 60), "white"), return_tensors="pt")
    features = image_features(model, pixels["pixel_values"])
    assert features.shape == (1, IMAGE_TOKENS, model.config.text_config.hidden_size) and IMAGE_TOKENS == GRID * GRID + 1
    layers = model.model.vision_tower(pixels["pixel_values"], output_hidden_states=True).hidden_states
    assert torch.allclose(features[0], model.model.multi_modal_projector(layers[-1])[0])  # CLS kept, last layer


def test_the_spread_phase_asks_every_row_what_its_picture_holds():
    """A present head that reads the picture's contents off a row: rows that do not carry them cost
    nothing while only CLS is asked, and count once every row is (the spread phase)."""
    rng = random.Random(4)
    patches, scenes = probe_targets([random_scene(rng) for _ in range(3)])
    held = presence(scenes)  # (pictures, colours + shapes)
    probe = VisionProbe(hidden=held.shape[1])
    with torch.no_grad():
        for head in probe.patch_heads:
            head.weight.zero_()  # the other heads' losses stay the same whatever the rows hold
        probe.present.weight.copy_(10 * torch.eye(held.shape[1]))
        probe.present.bias.fill_(-5.0)  # a row holding the target: logits +-5
    only_cls = torch.zeros(3, GRID * GRID + 1, held.shape[1])
    only_cls[:, 0] = held
    everywhere = held.unsqueeze(1).expand(-1, GRID * GRID + 1, -1).clone()
    loss = lambda features, every_row: probe.loss(features, patches, scenes, 1.0, every_row).item()
    assert loss(only_cls, every_row=True) > loss(only_cls, every_row=False) + 0.5
    assert loss(everywhere, every_row=True) == pytest.approx(loss(only_cls, every_row=False), abs=1e-3)


# -- Stage 4's conversations ---------------------------------------------------------------------

def user_turns(sample) -> list[tuple[str, str, list]]:
    """(user text, answer, the scenes of its message's real pictures) per turn, system message left out."""
    messages = [m for m in sample.messages if m["role"] != "system"]
    scenes, turns = iter(sample.scenes), []
    for user, answer in zip(messages[::2], messages[1::2]):
        pictures = [next(scenes) for _ in range(user["content"].count(IMAGE_MARK))]
        turns.append((user["content"], answer["content"], pictures))
    return turns


def follow_up_check(question: str, answer: str, scene) -> tuple[str, bool] | None:
    """(kind, right) for a text-only question about `scene`, worked out here from the scene, not by
    the chat builder's answer functions; None for chit-chat."""
    if question in TEXT_CHAT:
        return None
    said, colours = answer.lower(), [item.colour for item in scene.items]
    tokens = re.findall(r"[a-z]+", said)
    words = set(tokens)
    for template in PRESENCE_QUESTIONS:
        for colour in COLOURS:
            if question == template.format(a="an" if colour[0] in "aeiou" else "a", colour=colour):
                return "presence", answer == ("Yes." if colour in colours else "No.")
    kind = next(kind for kind, questions in QUESTIONS_OF.items() if question in questions)
    item = scene.items[0]
    right = {
        "shape": lambda: len(colours) == 1 and words & set(SHAPES) == {item.shape},
        "colour": lambda: len(colours) == 1 and words & set(COLOURS) == {item.colour},
        "count": lambda: words & {"one", "two"} == {["one", "two"][len(colours) - 1]},
        "position": lambda: len(colours) == 1 and [p for p in POSITIONS if p in said] == [POSITIONS[item.cell]],
        "describe": lambda: all(f"{i.colour} {i.shape}" in said for i in scene.items)
        and sum(token in SHAPES for token in tokens) == len(colours),
    }[kind]()
    return kind, right


def test_conversations_ask_for_a_picture_only_before_the_first_one():
    rng = random.Random(3)
    asked_before, asked_after, replies_after = 0, 0, 0
    for _ in range(400):
        sample = conversation_sample(rng)
        assert None not in sample.images and all(sample.answers), "every picture real, every answer trained"
        shown = False
        for _, answer, pictures in user_turns(sample):
            shown = shown or bool(pictures)
            asks = "send me a picture" in answer.lower()
            asked_before += asks and not shown
            asked_after += asks and shown
            replies_after += shown
    assert asked_before > 20 and replies_after > 500
    assert asked_after == 0


def test_conversations_hold_several_follow_ups_of_every_kind_answered_from_the_newest_picture():
    rng = random.Random(4)
    seen = {}  # (kind, its number among the follow-ups after its picture, 3 = third or later) -> count
    for _ in range(600):
        newest, since = None, 0
        for user, answer, pictures in user_turns(conversation_sample(rng)):
            if pictures:
                newest, since = (pictures[0] if len(pictures) == 1 else None), 0
                continue
            checked = follow_up_check(user, answer, newest) if newest is not None else None
            if checked is None:
                continue
            kind, right = checked
            assert right, (user, answer, newest)
            since += 1
            seen[kind, min(since, 3)] = seen.get((kind, min(since, 3)), 0) + 1
    assert all(seen.get((kind, n), 0) >= 10 for kind in [*QUESTIONS_OF, "presence"] for n in (1, 2, 3)), seen
