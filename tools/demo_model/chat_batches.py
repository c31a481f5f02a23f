"""Batches for the chat stages (2 and 3): `Sample`s from `chats` as tensors the language model eats.

In: samples, the tokenizer and processor. Out: right-padded ids and labels, where the real images'
rows go and their pixels, and the labels of stage 2's probes (which picture of its message an image
row belongs to; which picture holds the colour or shape a question names). Runs no model.
"""
from __future__ import annotations

import torch

from tools.demo_model.chats import IMAGE_MARK, IMAGE_TOKENS, Sample, encode_sample


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
    batch.update(query_labels(samples, encoded, tokenizer, image_id))
    if images:
        batch["pixel_values"] = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        batch["slots"] = torch.tensor(slots).repeat_interleave(IMAGE_TOKENS)
    return {k: v.to(device) for k, v in batch.items()}


def query_labels(samples: list[Sample], encoded: list[tuple[list[int], list[int]]], tokenizer,
                 image_id: int) -> dict[str, torch.Tensor]:
    """For the chats whose last question names a colour or shape to find: the batch row, the word's
    position and the picture holding it (see `Turn.query`); empty when no chat asks such a question."""
    queries = []
    for row, (sample, (seq, _)) in enumerate(zip(samples, encoded)):
        if sample.query is not None:
            position = last_index(seq, tokenizer.encode(" " + sample.query[0], add_special_tokens=False)[0])
            if position > last_index(seq, image_id):  # a word before the pictures cannot see them
                queries.append((row, position, sample.query[1]))
    if not queries:
        return {}
    return dict(zip(("query_rows", "query_positions", "query_labels"), map(torch.tensor, zip(*queries))))


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
