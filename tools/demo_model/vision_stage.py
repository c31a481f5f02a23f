"""Stage 1 of the demo model's training: the vision tower and projector alone, with linear probes.

In: a model from `architecture` and a seed. Out: the same model, its tower and projector trained
(the probes are thrown away). No language model runs here, so a step is cheap.

What the probes ask of the rows the language model will get (`image_features`: CLS first):
- every patch row names the colour and shape covering its patch and that shape's grid cell (one
  more class each for "no shape"): shapes are readable from any patch of the shape, two shapes stay
  apart, and each shape's rows say where it is;
- the CLS row names the whole picture: each shape's colour, shape and cell in reading order, and
  which colours and shapes it holds, so the language model can answer "Describe the image.", "How
  many shapes?" or "Which image has the red shape?" from one row per picture.
The CLS probe joins only for the last `picture_steps`, its weight ramped up over `picture_ramp`
steps, because earlier or at full weight it drowns the patch probe's shape signal.

A last, short phase (`every_row`, fresh probe, the tower at a lower rate) asks every row, not only
CLS, which colours and shapes its picture holds: a question word in stage 2 finds its picture's
contents only if any of the picture's rows will do. The measurements behind both choices are in
this package's README.md ("Lab notes").
"""
from __future__ import annotations

import random
import time

import numpy as np
import torch

from tools.demo_model.architecture import GRID, image_features, vision_parameters
from tools.demo_model.pictures import (
    COLOURS,
    SCENE_SLOTS,
    SHAPES,
    patch_labels,
    picture,
    random_scene,
    scene_labels,
)
from tools.demo_model.schedule import set_lr

KINDS = (len(COLOURS), len(SHAPES), 9)  # what a probe names about a shape: colour, shape, cell


class VisionProbe(torch.nn.Module):
    """Linear heads on the tower's rows (see the module docstring). Training only; not saved."""

    def __init__(self, hidden: int):
        super().__init__()
        self.patch_heads = torch.nn.ModuleList(torch.nn.Linear(hidden, n + 1) for n in KINDS)
        self.picture_heads = torch.nn.ModuleList(torch.nn.Linear(hidden, n + 1)
                                                 for _ in range(SCENE_SLOTS) for n in KINDS)
        self.present = torch.nn.Linear(hidden, len(COLOURS) + len(SHAPES))

    def loss(self, features: torch.Tensor, patches: tuple[torch.Tensor, ...], scenes: torch.Tensor,
             picture_weight: float, every_row: bool = False) -> torch.Tensor:
        # features (images, 1 + GRID * GRID, hidden), CLS first; patches: 3 x (images, GRID * GRID);
        # scenes (images, 3 * SCENE_SLOTS); -1 = no shape
        rows = features[:, 1:].reshape(-1, features.shape[-1])
        total = sum(head_loss(head, rows, label.reshape(-1))
                    for head, label in zip(self.patch_heads, patches, strict=True))
        if not picture_weight:
            return total
        cls = features[:, 0]
        whole = sum(head_loss(head, cls, label)
                    for head, label in zip(self.picture_heads, scenes.unbind(-1), strict=True))
        held, target = cls, presence(scenes)
        if every_row:  # every row, CLS included, is asked what its picture holds
            held, target = features, target.unsqueeze(1).expand(-1, features.shape[1], -1)
        whole = whole + torch.nn.functional.binary_cross_entropy_with_logits(self.present(held), target)
        return total + picture_weight * whole

    @torch.no_grad()
    def accuracy(self, features: torch.Tensor, patches: tuple[torch.Tensor, ...],
                 scenes: torch.Tensor) -> tuple[float, float]:
        """(shape patches named right, pictures whose CLS row names every slot right)."""
        covered = patches[1] >= 0
        named = self.patch_heads[1](features[:, 1:][covered]).argmax(-1) == patches[1][covered]
        cls = features[:, 0]
        slots = torch.stack([head(cls).argmax(-1) for head in self.picture_heads], dim=-1)
        wanted = torch.where(scenes < 0, scenes.new_tensor([h.out_features - 1 for h in self.picture_heads]), scenes)
        return named.float().mean().item(), (slots == wanted).all(-1).float().mean().item()


def head_loss(head: torch.nn.Linear, rows: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(head(rows), torch.where(label < 0, head.out_features - 1, label))


def presence(scenes: torch.Tensor) -> torch.Tensor:
    """(n, 3 * SCENE_SLOTS) scene labels -> (n, colours + shapes) multi-hot: what the picture holds."""
    hot = scenes.new_zeros((scenes.shape[0], len(COLOURS) + len(SHAPES)), dtype=torch.float32)
    for slot in range(SCENE_SLOTS):
        colour, shape = scenes[:, 3 * slot], scenes[:, 3 * slot + 1]
        filled = colour >= 0
        hot[filled, colour[filled]] = 1
        hot[filled, len(COLOURS) + shape[filled]] = 1
    return hot


def probe_targets(scenes) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """((colours, shapes, cells), each (images, GRID * GRID)), and (images, 3 * SCENE_SLOTS)."""
    labels = [patch_labels(scene, GRID) for scene in scenes]
    patches = tuple(torch.from_numpy(np.stack(column)) for column in zip(*labels))
    return patches, torch.from_numpy(np.stack([scene_labels(scene) for scene in scenes]))


class VisionBatches(torch.utils.data.Dataset):
    """Stage 1's batches: step N's pictures come from its own seed, so a worker process can draw
    the next batch while this one trains (Pillow's drawing is about half of a step) and the run
    stays the same bytes."""

    def __init__(self, processor, steps: int, batch_size: int, seed: int):
        self.processor, self.steps, self.batch_size, self.seed = processor, steps, batch_size, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        rng = random.Random(f"vision {self.seed} {step}")
        scenes = [random_scene(rng) for _ in range(self.batch_size)]
        images = [picture(scene, rng) for scene in scenes]
        return self.processor.image_processor(images, return_tensors="pt")["pixel_values"], probe_targets(scenes)


def picture_weight(step: int, steps: int, picture_steps: int, ramp: int) -> float:
    """0 before the last `picture_steps`, then rising linearly to 1 over `ramp` steps."""
    since = step - (steps - picture_steps)
    return 0.0 if since < 0 else min(1.0, (since + 1) / max(1, ramp))


def pretrain_vision(model, processor, *, steps: int, picture_steps: int, picture_ramp: int, batch_size: int,
                    lr: float, seed: int, device, every_row: bool = False, head_lr: float | None = None) -> None:
    """Stage 1 (see the module docstring); `model` is trained in place. With `every_row`, every row
    (not only CLS) must say which colours and shapes the picture holds; `head_lr`: the probe's own
    peak learning rate."""
    torch.manual_seed(seed + 1)
    probe = VisionProbe(model.config.text_config.hidden_size).to(device)
    optimizer = torch.optim.AdamW(parameter_groups(model, probe, lr=lr, head_lr=head_lr), weight_decay=0.01)
    start, threads = time.time(), torch.get_num_threads()
    batches = torch.utils.data.DataLoader(VisionBatches(processor, steps, batch_size, seed), batch_size=None,
                                          num_workers=1 if steps > 1 else 0)
    torch.set_num_threads(max(1, threads - 1))  # one core draws the next batch meanwhile
    model.train()
    for step, (pixel_values, (patches, scenes)) in enumerate(batches):
        features = image_features(model, pixel_values.to(device))
        patches, scenes = tuple(t.to(device) for t in patches), scenes.to(device)
        weight = picture_weight(step, steps, picture_steps, picture_ramp)
        loss = probe.loss(features, patches, scenes, weight, every_row)
        set_lr(optimizer, step, steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            named, whole = probe.accuracy(features.detach(), patches, scenes)
            print(f"vision step {step:5d}  probe loss {loss.item():.4f}  shape patches named {named:.3f}  "
                  f"pictures named whole by CLS {whole:.3f}  {time.time() - start:6.0f}s", flush=True)
    torch.set_num_threads(threads)


def parameter_groups(model, probe: VisionProbe, *, lr: float, head_lr: float | None) -> list[dict]:
    """The tower, projector and probe at peak `lr`; with `head_lr`, the probe at its own peak."""
    if head_lr is None:
        return [{"params": vision_parameters(model) + list(probe.parameters()), "peak": lr}]
    return [{"params": vision_parameters(model), "peak": lr},
            {"params": list(probe.parameters()), "peak": head_lr}]
