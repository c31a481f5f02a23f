"""The training loop the chat stages (2, 3 and 4) run, and its quick check.

In: a model, the parameter groups to train (each with its "peak" rate), a sampler of chats and a
loss. Out: the model trained in place; every `ChatRun.every` steps a quick check through Hugging
Face's own `generate` and a checkpoint. Which chats and which loss are the stages' business.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tools.demo_model.architecture import vision_parameters
from tools.demo_model.chat_batches import collate
from tools.demo_model.chats import Sample, Turn, presence_turn, single_image_turn, text_turn, two_image_turn
from tools.demo_model.conversations import follow_up_turn
from tools.demo_model.schedule import set_lr


@dataclass(frozen=True)
class ChatRun:
    """How a chat stage's loop runs, the same for stages 2, 3 and 4."""
    batch_size: int
    device: str
    checkpoint: Callable[[], None] | None = None  # saves the model; None: no checks, no checkpoints
    every: int = 300  # steps between a quick check and a checkpoint
    check_n: int = 32  # questions per kind in each quick check


def language_parameters(model) -> list[torch.nn.Parameter]:
    tower = {id(p) for p in vision_parameters(model)}
    return [p for p in model.parameters() if id(p) not in tower]


def run_steps(model, tokenizer, processor, run: ChatRun, *, groups: list[dict], sample: Callable[[int], Sample],
              steps: int, loss_of: Callable[[dict], tuple[torch.Tensor, torch.Tensor]], label: str) -> None:
    """AdamW over `groups` (each with its "peak" rate) on batches of `sample(step)`; `loss_of(batch)`
    gives (answer loss, probe loss). The parameters outside `groups` are frozen meanwhile."""
    params = [p for group in groups for p in group["params"]]
    trained = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in trained]
    for param in frozen:
        param.requires_grad_(False)
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    for step in range(steps):
        batch = collate([sample(step) for _ in range(run.batch_size)], tokenizer, processor, run.device)
        set_lr(optimizer, step, steps)
        loss, aux = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        (loss + 0.5 * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"{label} step {step:5d}  loss {loss.item():.4f}  probe {aux.item():.4f}  "
                  f"{time.time() - start:6.0f}s", flush=True)
        if run.checkpoint is not None and (step + 1) % run.every == 0 and step + 1 < steps:
            print(f"{label} step {step + 1:5d}  quick check {quick_check(model, processor, run.device, run.check_n)}",
                  flush=True)
            run.checkpoint()
            model.train()
    model.eval()
    for param in frozen:
        param.requires_grad_(True)


@torch.inference_mode()
def quick_check(model, processor, device, n: int = 32) -> dict[str, float]:
    """Exact-answer share on n fresh single-turn questions per kind, through HF's own
    `generate(**processor(...))`: cheap, so it can run during training (`eval` measures through the host)."""
    model.eval()
    rng = random.Random(999)
    makers = {"shape": lambda: [single_image_turn(rng, "shape")], "colour": lambda: [single_image_turn(rng, "colour")],
              "count": lambda: [single_image_turn(rng, "count")],
              "position": lambda: [single_image_turn(rng, "position")],
              "describe": lambda: [single_image_turn(rng, "describe")], "order": lambda: [two_image_turn(rng, "order")],
              "presence": lambda: [presence_turn(rng)], "text": lambda: [text_turn(rng)],
              "follow": lambda: follow_up_chat(rng)}
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    scores = {}
    for kind, make in makers.items():
        chats = [make() for _ in range(n)]  # each: the turns of one chat; the last one's answer is asked for
        prompts = [tokenizer.apply_chat_template(messages_before_answer(chat), tokenize=False,
                                                 add_generation_prompt=True) for chat in chats]
        images = [image for chat in chats for turn in chat for image in turn.images] or None
        inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True).to(device)
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        scores[kind] = round(sum(r.strip() == chat[-1].answer for r, chat in zip(replies, chats)) / n, 3)
    return scores


def follow_up_chat(rng: random.Random) -> list[Turn]:
    """A question with a picture, then a text-only question about that picture."""
    first = single_image_turn(rng)
    return [first, follow_up_turn(rng, first.scenes[0])]


def messages_before_answer(turns: list[Turn]) -> list[dict]:
    messages = [{"role": role, "content": text} for turn in turns
                for role, text in (("user", turn.user), ("assistant", turn.answer))]
    return messages[:-1]
