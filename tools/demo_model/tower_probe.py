"""How well a tower's rows tell the shapes of a two-shape picture apart, with no language model.

    python -m tools.demo_model.tower_probe                      # the shipped tower, about 5 minutes
    python -m tools.demo_model.tower_probe --model DIR --train 30000 --test 4000

Run from the repository root. In: a saved model folder (its tower, projector and image processor).
Out: printed error rates. A small attention read-out is trained on the frozen rows the language
model gets (`architecture.image_features`) to name each shape of fresh two-shape pictures from the
training renderer, asked with the shape's colour and its slot (first or second in reading order).
Then it names the shapes of other fresh pictures: the share of pictures with a shape named wrong,
for all of them and by aspect ratio (near square 0.8-1.25, wide, tall; the processor squashes the
picture to a square). A language model reading the same rows has done no better: the shipped
model describes about as many two-shape pictures wrong. So this measures a tower design in minutes
where a full retrain takes hours (README.md, "Lab notes").
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from tools.demo_model.architecture import image_features
from tools.demo_model.pictures import COLOURS, SCENE_SLOTS, SHAPES, picture, random_scene, scene_labels
from tools.demo_model.schedule import set_lr

ROOT = Path(__file__).resolve().parents[2]
ASPECTS = {"near square": (0.8, 1.25), "wide": (1.25, np.inf), "tall": (0.0, 0.8)}  # width / height


class Pictures(NamedTuple):
    rows: torch.Tensor  # (pictures, rows per image, hidden): what the language model gets
    colours: torch.Tensor  # (pictures, 2): each shape's colour index, in reading order
    shapes: torch.Tensor  # (pictures, 2)
    aspects: np.ndarray  # (pictures,) width / height


@torch.inference_mode()
def two_shape_pictures(model, processor, seed: int, count: int, batch: int = 500) -> Pictures:
    rng = random.Random(seed)
    rows, labels, aspects = [], [], []
    for start in range(0, count, batch):
        scenes = [random_scene(rng, count=2) for _ in range(min(batch, count - start))]
        pixels = processor.image_processor([picture(scene, rng) for scene in scenes], return_tensors="pt")
        rows.append(image_features(model, pixels["pixel_values"]).float())
        labels += [scene_labels(scene).reshape(SCENE_SLOTS, 3) for scene in scenes]  # (colour, shape, cell)
        aspects += [scene.size[0] / scene.size[1] for scene in scenes]
    labels = torch.from_numpy(np.stack(labels))
    return Pictures(torch.cat(rows), labels[..., 0], labels[..., 1], np.array(aspects))


class ShapeReadout(torch.nn.Module):
    """One attention query per shape (its colour and slot) over a picture's rows, then an MLP."""

    def __init__(self, hidden: int):
        super().__init__()
        self.colour = torch.nn.Embedding(len(COLOURS), hidden)
        self.slot = torch.nn.Embedding(2, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.attention = torch.nn.MultiheadAttention(hidden, 4, batch_first=True)
        self.head = torch.nn.Sequential(torch.nn.Linear(2 * hidden, 256), torch.nn.GELU(),
                                        torch.nn.Linear(256, len(SHAPES)))

    def forward(self, rows: torch.Tensor, colour: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        query = (self.colour(colour) + self.slot(slot))[:, None]  # (n, 1, hidden)
        keys = self.norm(rows)
        read, _ = self.attention(query, keys, keys)
        return self.head(torch.cat([read[:, 0], query[:, 0]], dim=-1))  # (n, shapes) logits

    def wrong(self, data: Pictures) -> torch.Tensor:
        """(pictures,) True where a shape of the picture is named wrong."""
        with torch.no_grad():
            misses = [self(data.rows, data.colours[:, slot], torch.full_like(data.colours[:, slot], slot))
                      .argmax(-1) != data.shapes[:, slot] for slot in (0, 1)]
        return misses[0] | misses[1]


def train_readout(data: Pictures, *, steps: int, seed: int, batch: int = 256, lr: float = 2e-3) -> ShapeReadout:
    torch.manual_seed(seed)
    readout = ShapeReadout(data.rows.shape[-1])
    optimizer = torch.optim.AdamW([{"params": list(readout.parameters()), "peak": lr}])
    for step in range(steps):
        index = torch.randint(0, len(data.rows), (batch,))
        slot = torch.randint(0, 2, (batch,))
        set_lr(optimizer, step, steps)
        logits = readout(data.rows[index], data.colours[index, slot], slot)
        loss = torch.nn.functional.cross_entropy(logits, data.shapes[index, slot])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return readout


def error_rates(readout: ShapeReadout, data: Pictures) -> dict[str, float]:
    """Share of pictures with a shape named wrong: all, then by aspect ratio."""
    wrong = readout.wrong(data).numpy()
    rates = {"all": float(wrong.mean())}
    for name, (low, high) in ASPECTS.items():
        chosen = (data.aspects >= low) & (data.aspects < high)
        rates[name] = float(wrong[chosen].mean()) if chosen.any() else float("nan")
    return rates


def measure(model_dir: Path, *, train: int, test: int, steps: int, seed: int) -> dict[str, float]:
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    readout = train_readout(two_shape_pictures(model, processor, seed, train), steps=steps, seed=seed)
    return error_rates(readout, two_shape_pictures(model, processor, seed + 1, test))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-llava-shapes")
    parser.add_argument("--train", type=int, default=30000, help="two-shape pictures the read-out learns from")
    parser.add_argument("--test", type=int, default=4000, help="fresh pictures it is measured on")
    parser.add_argument("--steps", type=int, default=3000, help="read-out training steps (batch 256)")
    parser.add_argument("--seed", type=int, default=101, help="pictures from seed and seed + 1 (training never "
                                                               "used them)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rates = measure(args.model, train=args.train, test=args.test, steps=args.steps, seed=args.seed)
    print("two-shape pictures with a shape named wrong: "
          + ", ".join(f"{name} {100 * rate:.2f}%" for name, rate in rates.items()))
    return rates


if __name__ == "__main__":
    main()
