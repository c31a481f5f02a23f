"""Stage 4 of the demo model's training: conversations, as people have them with the demo.

In: a model after stage 3 (`polish_stage`). Out: the language model (and the tower, at its own
rate when that is above 0) trained on `conversations`: a picture, then text-only follow-ups about
it in any order and of every kind, chit-chat, new pictures. Stages 2 and 3 stack independent turns,
each question beside its own picture; with those alone the model answered a follow-up about a
picture in the history poorly (at turn 4 about half right) and mixed the no-picture greeting
("Send me a picture") into follow-up replies, and counted the history's pictures ("There are two
shapes."). No probes; the loop is stage 3's (`polish_stage.train_whole_model`).
"""
from __future__ import annotations

from tools.demo_model.chat_loop import ChatRun
from tools.demo_model.conversations import conversation_sample
from tools.demo_model.polish_stage import train_whole_model


def converse_chats(model, tokenizer, processor, run: ChatRun, *, steps: int, lr: float, tower_lr: float,
                   seed: int) -> None:
    """Stage 4: `steps` batches of conversations (`--resume-at converse` goes on from stage 3)."""
    train_whole_model(model, tokenizer, processor, run, sample=conversation_sample, steps=steps, lr=lr,
                      tower_lr=tower_lr, seed=seed + 7, label="converse")
