"""The demo model's training data and training script (tools/demo_pictures.py, tools/train_demo_model.py).

- Every shape lies in the cell of the **whole picture** that its answer names, on canvases of any
  size and aspect ratio (only a large lone shape in the centre may spill over), and the per-patch
  labels put it in the same cell of the processor's square; the picture labels list its shapes in
  reading order.
- The processor crops nothing: a mark at a picture's very edge reaches the model's pixels.
- Training is reproducible bit for bit from its seed (two short runs, byte-identical weights).
"""
from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from PIL import Image

from tools.demo_pictures import COLOURS, CENTER, CELL_HALF, SHAPES, draw_scene, patch_labels, random_scene, scene_labels
from tools.train_demo_model import GRID, build_processor, build_tokenizer
from tools.train_demo_model import main as train


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


def test_training_is_reproducible_bit_for_bit(tmp_path):
    # stage 1 both without and with the picture heads, its pictures drawn by the worker process
    steps = ["--vision-steps", "3", "--picture-steps", "1", "--steps", "2",
             "--vision-batch-size", "4", "--batch-size", "2", "--check-n", "1", "--threads", "2"]
    digests = []
    for run in ("a", "b"):
        train(steps + ["--out", str(tmp_path / run)])
        digests.append(hashlib.sha256((tmp_path / run / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
