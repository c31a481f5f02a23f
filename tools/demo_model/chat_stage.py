"""Stages 2 and 3 of the demo model's training: a fresh language model on chats, on the frozen
tower; then the whole model.

In: a model whose tower and projector stage 1 trained (`demo_vision_stage`), a tokenizer and
processor from `demo_architecture`. Out: stage 2 trains the language model and `lm_head` and leaves
the tower and projector as they are (so `--resume` from any saved model reruns exactly this stage);
stage 3 (`polish_chats`) trains everything, the tower at a lower rate, on a mix in which half the
chats describe a two-shape picture: the answer that needs the most from the tower (both shapes and
colours in reading order) and the one stage 2 left weakest. Chats come from `demo_chats`, encoded as
the multimodal extension encodes a prompt.

Stage 2 has two probes on the language model's hidden states (training only, not saved) that make
the two-picture lookup learnable: an order probe on image rows (is the row's picture the first or
the second of its message?), and a query probe on the question's colour or shape word ("Which image
has the blue shape?"): which picture holds it, or none. Without the query probe two-image answers
stayed at chance: the lookup is useless until its read-out exists and vice versa. Both need every
image row to carry what its picture holds (stage 1's last phase). Stage 3 needs them no more.
"""
from __future__ import annotations

import random
import time

import torch

from tools.demo_architecture import image_features, vision_parameters
from tools.demo_chats import (
    IMAGE_MARK,
    IMAGE_TOKENS,
    Sample,
    encode_sample,
    make_sample,
    presence_turn,
    single_image_turn,
    text_turn,
    two_image_turn,
)
from tools.demo_pictures import random_scene
from tools.demo_schedule import set_lr

ORDER_PROBE_LAYER = 2  # hidden_states index: the output of the LM's second layer
QUERY_PROBE_LAYER = 3  # the third layer's output: the fourth carries the finding to the answer


# -- Batches ----------------------------------------------------------------------------------

def collate(samples: list[Sample], tokenizer, processor, device) -> dict[str, torch.Tensor]:
    """Right-padded ids/labels, the real images' pixels, where their rows go, and probe labels."""
    encoded = [encode_sample(s, tokenizer) for s in samples]
    length = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(samples), length), tokenizer.pad_token_id)
    labels = torch.full((len(samples), length), -100)
    feature_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    images, slots = [], []
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_MARK)
    for row, (sample, (seq, lab)) in enumerate(zip(samples, encoded)):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(lab)] = torch.tensor(lab)
        for start, image in zip(image_starts(seq, image_id), sample.images, strict=True):
            if image is not None:
                feature_mask[row, start:start + IMAGE_TOKENS] = True
                images.append(image)
        slots += sample.slots
    batch = {"ids": ids, "labels": labels, "attention_mask": ids != tokenizer.pad_token_id,
             "feature_mask": feature_mask}
    queries = []
    for row, (sample, (seq, _)) in enumerate(zip(samples, encoded)):
        if sample.query is not None:
            position = last_index(seq, tokenizer.encode(" " + sample.query[0], add_special_tokens=False)[0])
            if position > last_index(seq, image_id):  # a word before the pictures cannot see them
                queries.append((row, position, sample.query[1]))
    if queries:
        batch["query_rows"], batch["query_positions"], batch["query_labels"] = map(torch.tensor, zip(*queries))
    if images:
        batch["pixel_values"] = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        batch["slots"] = torch.tensor(slots).repeat_interleave(IMAGE_TOKENS)
    return {k: v.to(device) for k, v in batch.items()}


def last_index(seq: list[int], token: int) -> int:
    """The question's word: the last one in the chat (the answers to such questions never repeat it)."""
    return len(seq) - 1 - seq[::-1].index(token)


def image_starts(seq: list[int], image_id: int) -> list[int]:
    """Where each image's rows begin; adjacent images make one run, a new image every IMAGE_TOKENS ids."""
    starts, run = [], 0
    for i, token in enumerate(seq):
        if token != image_id:
            run = 0
            continue
        if run % IMAGE_TOKENS == 0:
            starts.append(i)
        run += 1
    return starts


def chat_sample(rng: random.Random, progress: float) -> Sample:
    """Stage 2's mix: colour matching ("Is there a blue shape?") early, two-image questions later,
    single-image questions, text and chats with history throughout."""
    makers = [single_image_turn, presence_turn, two_image_turn, text_turn]
    weights = [4, 4, 1, 1] if progress < 0.3 else [3, 2, 4, 1]
    earlier = 0 if progress < 0.3 else earlier_turns(rng)
    return make_sample(rng, earlier, rng.choices(makers, weights=weights)[0](rng))


def earlier_turns(rng: random.Random) -> int:
    """How many finished turns come before the one answered, once chats have history."""
    return rng.choices([0, 1, 2], weights=[6, 3, 1])[0]


# -- The loss ---------------------------------------------------------------------------------

class ChatProbes(torch.nn.Module):
    """`order` names from an image row inside the LM whether its image is its message's first or
    second; `query` names from the question's colour/shape word the picture holding it (first,
    second, none)."""

    def __init__(self, hidden: int, query_weight: float = 1.0):
        super().__init__()
        self.query_weight = query_weight
        self.order = torch.nn.Linear(hidden, 2)
        self.query = torch.nn.Linear(hidden, 3)


def chat_loss(model, probes: ChatProbes | None, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the answer tokens (image rows filled as the extension fills them), and the
    probes' loss (zero without probes). The tower gets gradients when its parameters want them
    (`run_steps` freezes what it does not train)."""
    embeds = model.get_input_embeddings()(batch["ids"])  # (batch, seq, hidden)
    if "pixel_values" in batch:
        features = image_features(model, batch["pixel_values"])  # (images, IMAGE_TOKENS, hidden)
        embeds = embeds.masked_scatter(batch["feature_mask"].unsqueeze(-1), features.to(embeds.dtype))
    out = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                                     output_hidden_states=True)
    aux = probe_loss(probes, out.hidden_states, batch) if probes is not None else embeds.new_zeros(())
    targets = batch["labels"][:, 1:]
    picked = targets != -100  # only answer positions go through lm_head
    logits = model.lm_head(out.last_hidden_state[:, :-1][picked])
    return torch.nn.functional.cross_entropy(logits, targets[picked]), aux


def probe_loss(probes: ChatProbes, hidden_states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = hidden_states[0].new_zeros(())
    if "pixel_values" in batch:
        rows = hidden_states[ORDER_PROBE_LAYER][batch["feature_mask"]]  # (image rows, hidden), in image order
        loss = loss + torch.nn.functional.cross_entropy(probes.order(rows), batch["slots"])
    if "query_rows" in batch:
        words = hidden_states[QUERY_PROBE_LAYER][batch["query_rows"], batch["query_positions"]]  # (queries, hidden)
        query = torch.nn.functional.cross_entropy(probes.query(words), batch["query_labels"])
        loss = loss + probes.query_weight * query
    return loss


# -- Training ---------------------------------------------------------------------------------

def train_chats(model, tokenizer, processor, steps: int, batch_size: int, lr: float, seed: int, device,
                checkpoint=None, every: int = 300, check_n: int = 32, query_weight: float = 1.0) -> None:
    """Stage 2 (see the module docstring). Its own seeds (data, the language model's weights,
    probes), so `--resume` from a saved model gives what a full run gives."""
    rng = random.Random(seed + 3)
    torch.manual_seed(seed + 3)
    fresh = type(model)(model.config)
    model.model.language_model.load_state_dict(fresh.model.language_model.state_dict())
    model.lm_head.load_state_dict(fresh.lm_head.state_dict())
    torch.manual_seed(seed + 3)
    probes = ChatProbes(model.config.text_config.hidden_size, query_weight).to(device)
    groups = [{"params": language_parameters(model) + list(probes.parameters()), "peak": lr}]
    run_steps(model, processor, groups, lambda step: chat_sample(rng, step / steps), steps,
              lambda batch: chat_loss(model, probes, batch), "chat", tokenizer, batch_size, device,
              checkpoint, every, check_n)


def polish_sample(rng: random.Random) -> Sample:
    """Stage 3's mix: a two-shape picture described (the longest answer about a picture: both
    shapes and colours, in reading order) as often as stage 2's late mix, so nothing else fades."""
    if rng.random() < 0.5:
        turn = single_image_turn(rng, "describe", random_scene(rng, count=2))
        return make_sample(rng, earlier_turns(rng), turn)
    return chat_sample(rng, 1.0)


def polish_chats(model, tokenizer, processor, steps: int, batch_size: int, lr: float, tower_lr: float, seed: int,
                 device, checkpoint=None, every: int = 300, check_n: int = 32) -> None:
    """Stage 3: the whole model on chats, the tower at `tower_lr` (0: frozen), no probes. Its own
    seeds, so `--resume-at polish` from stage 2's checkpoint gives what a full run gives."""
    rng = random.Random(seed + 5)
    torch.manual_seed(seed + 5)
    groups = [{"params": language_parameters(model), "peak": lr}]
    if tower_lr > 0:
        groups.append({"params": vision_parameters(model), "peak": tower_lr})
    run_steps(model, processor, groups, lambda step: polish_sample(rng), steps,
              lambda batch: chat_loss(model, None, batch), "polish", tokenizer, batch_size, device,
              checkpoint, every, check_n)


def language_parameters(model) -> list[torch.nn.Parameter]:
    tower = {id(p) for p in vision_parameters(model)}
    return [p for p in model.parameters() if id(p) not in tower]


def run_steps(model, processor, groups: list[dict], sample, steps: int, loss_of, label: str, tokenizer,
              batch_size: int, device, checkpoint, every: int, check_n: int) -> None:
    """AdamW over `groups` (each with its "peak" rate) on batches of `sample(step)`; the parameters
    outside them are frozen meanwhile. A quick check and a checkpoint every `every` steps."""
    params = [p for group in groups for p in group["params"]]
    trained = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in trained]
    for param in frozen:
        param.requires_grad_(False)
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    for step in range(steps):
        batch = collate([sample(step) for _ in range(batch_size)], tokenizer, processor, device)
        set_lr(optimizer, step, steps)
        loss, aux = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        (loss + 0.5 * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"{label} step {step:5d}  loss {loss.item():.4f}  probe {aux.item():.4f}  "
                  f"{time.time() - start:6.0f}s", flush=True)
        if checkpoint is not None and (step + 1) % every == 0 and step + 1 < steps:
            print(f"{label} step {step + 1:5d}  quick check {quick_check(model, processor, device, check_n)}",
                  flush=True)
            checkpoint()
            model.train()
    model.eval()
    for param in frozen:
        param.requires_grad_(True)


@torch.inference_mode()
def quick_check(model, processor, device, n: int = 32) -> dict[str, float]:
    """Exact-answer share on n fresh single-turn questions per kind, through HF's own
    `generate(**processor(...))` (cheap; tools/eval_demo_model.py measures through the host)."""
    model.eval()
    rng = random.Random(999)
    makers = {"shape": lambda: single_image_turn(rng, "shape"), "colour": lambda: single_image_turn(rng, "colour"),
              "count": lambda: single_image_turn(rng, "count"), "position": lambda: single_image_turn(rng, "position"),
              "describe": lambda: single_image_turn(rng, "describe"), "order": lambda: two_image_turn(rng, "order"),
              "presence": lambda: presence_turn(rng),
              "text": lambda: text_turn(rng)}
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    scores = {}
    for kind, make in makers.items():
        turns = [make() for _ in range(n)]
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t.user}], tokenize=False,
                                                 add_generation_prompt=True) for t in turns]
        images = [image for t in turns for image in t.images] or None
        inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True).to(device)
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        scores[kind] = round(sum(r.strip() == t.answer for r, t in zip(replies, turns)) / n, 3)
    return scores
