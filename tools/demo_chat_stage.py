"""Stage 2 of the demo model's training: a fresh language model on chats, on the frozen tower.

In: a model whose tower and projector stage 1 trained (`demo_vision_stage`), a tokenizer and
processor from `demo_architecture`. Out: the same model with its language model and `lm_head`
trained; the tower and projector are not changed (so `--resume` from any saved model reruns exactly
this stage). Chats come from `demo_chats`, encoded as the multimodal extension encodes a prompt.

Two probes on the language model's hidden states (training only, not saved) make the two-picture
lookup learnable: an order probe on image rows (is the row's picture the first or the second of its
message?), and a query probe on the question's colour or shape word ("Which image has the blue
shape?"): which picture holds it, or none. Without the query probe two-image answers stayed at
chance: the lookup is useless until its read-out exists and vice versa. Both need every image row
to carry what its picture holds (stage 1's last phase).
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
    earlier = 0 if progress < 0.3 else rng.choices([0, 1, 2], weights=[6, 3, 1])[0]
    return make_sample(rng, earlier, rng.choices(makers, weights=weights)[0](rng))


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


def chat_loss(model, probes: ChatProbes, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the answer tokens (image rows filled as the extension fills them), and the
    probes' loss."""
    embeds = model.get_input_embeddings()(batch["ids"])  # (batch, seq, hidden)
    if "pixel_values" in batch:
        with torch.no_grad():  # the tower is frozen
            features = image_features(model, batch["pixel_values"])  # (images, IMAGE_TOKENS, hidden)
        embeds = embeds.masked_scatter(batch["feature_mask"].unsqueeze(-1), features.to(embeds.dtype))
    out = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                                     output_hidden_states=True)
    aux = embeds.new_zeros(())
    if "pixel_values" in batch:
        rows = out.hidden_states[ORDER_PROBE_LAYER][batch["feature_mask"]]  # (image rows, hidden), in image order
        aux = aux + torch.nn.functional.cross_entropy(probes.order(rows), batch["slots"])
    if "query_rows" in batch:
        words = out.hidden_states[QUERY_PROBE_LAYER][batch["query_rows"], batch["query_positions"]]  # (queries, hidden)
        aux = aux + probes.query_weight * torch.nn.functional.cross_entropy(probes.query(words), batch["query_labels"])
    targets = batch["labels"][:, 1:]
    picked = targets != -100  # only answer positions go through lm_head
    logits = model.lm_head(out.last_hidden_state[:, :-1][picked])
    return torch.nn.functional.cross_entropy(logits, targets[picked]), aux


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
    tower = vision_parameters(model)
    for param in tower:
        param.requires_grad_(False)
    tower_ids = {id(p) for p in tower}
    params = [p for p in model.parameters() if id(p) not in tower_ids] + list(probes.parameters())
    optimizer = torch.optim.AdamW([{"params": params, "peak": lr}], weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    for step in range(steps):
        batch = collate([chat_sample(rng, step / steps) for _ in range(batch_size)], tokenizer, processor, device)
        set_lr(optimizer, step, steps)
        loss, aux = chat_loss(model, probes, batch)
        optimizer.zero_grad(set_to_none=True)
        (loss + 0.5 * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"chat step {step:5d}  loss {loss.item():.4f}  probe {aux.item():.4f}  {time.time() - start:6.0f}s",
                  flush=True)
        if checkpoint is not None and (step + 1) % every == 0 and step + 1 < steps:
            print(f"chat step {step + 1:5d}  quick check {quick_check(model, processor, device, check_n)}", flush=True)
            checkpoint()
            model.train()
    model.eval()
    for param in tower:
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
