"""The eval's second renderer (tools/demo_model/eval_pictures.py): every shape lies in the cell of the whole
picture that its answer names, in its colour, on canvases of any size and aspect ratio."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tools.demo_model import eval_pictures
from tools.demo_model.pictures import COLOURS


def shape_pixels(image) -> np.ndarray:
    """(y, x) of pixels no light background has: some channel below 110 (every shade has one below 70)."""
    return np.argwhere(np.asarray(image).min(axis=2) < 110)


@pytest.mark.parametrize("seed", range(40))
def test_a_lone_shape_lies_in_the_cell_its_answer_names(seed):
    rng = random.Random(seed)
    scene = eval_pictures.random_scene(rng, count=1)
    image = eval_pictures.picture(scene, rng)
    width, height = image.size
    assert 96 * 0.6 - 1 <= min(width, height) and max(width, height) <= 300
    ys, xs = shape_pixels(image).T
    assert len(ys) > 20, "the shape is visible"
    row, col = divmod(scene.items[0].cell, 3)
    assert row * height / 3 <= ys.min() and ys.max() < (row + 1) * height / 3, (scene, image.size)
    assert col * width / 3 <= xs.min() and xs.max() < (col + 1) * width / 3, (scene, image.size)


@pytest.mark.parametrize("seed", range(20))
def test_two_shapes_differ_in_colour_and_each_is_drawn_in_a_shade_of_its_colour(seed):
    rng = random.Random(1000 + seed)
    scene = eval_pictures.random_scene(rng, count=2)
    assert len({item.colour for item in scene.items}) == 2
    assert [item.cell for item in scene.items] == sorted(item.cell for item in scene.items)
    image = np.asarray(eval_pictures.picture(scene, rng)).astype(float)
    height, width = image.shape[:2]
    for item in scene.items:
        y, x = int(item.cy * height), int(item.cx * width)
        centre = image[y, x]
        nearest = min(COLOURS, key=lambda name: min(np.abs(np.array(shade) - centre).sum()
                                                   for shade in eval_pictures.SHADES[name]))
        assert nearest == item.colour, (item, centre)
