"""tools/demo_model/tower_probe.py: the read-out that measures how well a tower's rows name the shapes
of two-shape pictures. It must tell a trained tower from an untrained one of the same design, and
count a picture wrong when either of its shapes is named wrong."""
from __future__ import annotations

import numpy as np
import torch

from tests.conftest import ROOT
from tools.demo_model.architecture import build_model, build_processor, build_tokenizer
from tools.demo_model.pictures import SHAPES
from tools.demo_model.tower_probe import Pictures, ShapeReadout, error_rates, measure

SMALL = dict(train=800, test=300, steps=300, seed=101)


def test_the_read_out_tells_the_shipped_tower_from_an_untrained_one(tmp_path):
    tokenizer = build_tokenizer()
    build_model(tokenizer, seed=0).save_pretrained(tmp_path)
    build_processor(tokenizer).save_pretrained(tmp_path)
    shipped = measure(ROOT / "models" / "tiny-llava-shapes", **SMALL)
    untrained = measure(tmp_path, **SMALL)
    assert shipped["all"] < 0.1, shipped
    assert untrained["all"] > 3 * shipped["all"] + 0.1, (untrained, shipped)
    assert set(shipped) == {"all", "near square", "wide", "tall"}


class SecondSlotBlind(ShapeReadout):
    """Names every shape as the first of SHAPES unless it is the first slot's shape (known here)."""

    def __init__(self, truth: torch.Tensor):
        super().__init__(hidden=8)
        self.truth = truth

    def forward(self, rows, colour, slot):
        logits = torch.zeros(len(rows), len(SHAPES))
        logits[torch.arange(len(rows)), torch.where(slot == 0, self.truth, 0)] = 1
        return logits


def test_a_picture_counts_wrong_when_either_shape_is_named_wrong():
    shapes = torch.tensor([[1, 0], [2, 3], [3, 3]])  # second shapes: right (0), wrong, wrong
    data = Pictures(rows=torch.zeros(3, 2, 8), colours=torch.tensor([[0, 1], [2, 3], [4, 5]]), shapes=shapes,
                    aspects=np.array([1.0, 2.0, 0.5]))
    rates = error_rates(SecondSlotBlind(shapes[:, 0]), data)
    assert rates == {"all": 2 / 3, "near square": 0.0, "wide": 1.0, "tall": 1.0}
