"""Stage 3 of the demo model's training: the whole model end to end on chats.

In: a model after stage 2 (`chat_stage`). Out: everything trained, the tower at its own lower rate,
no probes, on a mix in which half the chats describe a two-shape picture: the answer that needs the
most from the tower (both shapes and colours in reading order) and the one stage 2 leaves weakest;
here its loss reaches the tower too. The other half is stage 2's late mix. Stage 4
(`converse_stage`) runs this stage's loop (`train_whole_model`) on conversations.
"""
from __future__ import annotations

import random
from collections.abc import Callable

import torch

from tools.demo_model.architecture import vision_parameters
from tools.demo_model.chat_loop import ChatRun, language_parameters, run_steps
from tools.demo_model.chat_stage import chat_loss, chat_sample, earlier_turns
from tools.demo_model.chats import Sample, make_sample, single_image_turn
from tools.demo_model.pictures import random_scene


def polish_sample(rng: random.Random) -> Sample:
    """Stage 3's mix: a two-shape picture described (the longest answer about a picture: both
    shapes and colours, in reading order) as often as stage 2's late mix, so nothing else fades."""
    if rng.random() < 0.5:
        turn = single_image_turn(rng, "describe", random_scene(rng, count=2))
        return make_sample(rng, earlier_turns(rng), turn)
    return chat_sample(rng, 1.0)


def train_whole_model(model, tokenizer, processor, run: ChatRun, *, sample: Callable[[random.Random], Sample],
                      steps: int, lr: float, tower_lr: float, seed: int, label: str) -> None:
    """`steps` batches of `sample(rng)`, no probes: the language model at peak `lr`, the tower and
    projector at `tower_lr` (0: frozen). `seed` seeds the stage's own streams (its chats and torch's),
    so resuming a saved model at this stage gives what a full run gives."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    groups = [{"params": language_parameters(model), "peak": lr}]
    if tower_lr > 0:
        groups.append({"params": vision_parameters(model), "peak": tower_lr})
    run_steps(model, tokenizer, processor, run, groups=groups, sample=lambda step: sample(rng),
              steps=steps, loss_of=lambda batch: chat_loss(model, None, batch), label=label)


def polish_chats(model, tokenizer, processor, run: ChatRun, *, steps: int, lr: float, tower_lr: float,
                 seed: int) -> None:
    """Stage 3: the whole model on `polish_sample`'s chats (`--resume-at polish` goes on from stage 2)."""
    train_whole_model(model, tokenizer, processor, run, sample=polish_sample, steps=steps, lr=lr,
                      tower_lr=tower_lr, seed=seed + 5, label="polish")
