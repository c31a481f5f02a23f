"""Keeping the model from generating image placeholder tokens: in a reply they stand for nothing.

- `placeholder_ids(pipeline)`: the ids to ban (the pipeline's `placeholder_token_id()`).
- `ban(logits, ids)`: `(rows, vocab)` logits with those columns at -inf, in place; ids outside the
  vocabulary are skipped (text-generation-webui's LLaVA pipelines use an id one past the vocabulary).
- `HFPlaceholderBan`: the rule as a Hugging Face LogitsProcessor, for text-generation-webui, where
  `logits_processor_modifier` adds it. This repository's host runs `placeholder_ban_batch` instead.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
from transformers import LogitsProcessor


def placeholder_ids(pipeline) -> list[int]:
    return [int(pipeline.placeholder_token_id())]


def ban(logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """`logits` (rows, vocab) with the columns `ids` set to -inf (in place)."""
    columns = banned_columns(tuple(ids), logits.shape[-1], logits.device)
    return logits.index_fill_(-1, columns, float("-inf")) if columns is not None else logits


@functools.lru_cache(maxsize=8)
def banned_columns(ids: tuple[int, ...], vocab: int, device: torch.device) -> torch.Tensor | None:
    """`ids` inside the vocabulary, as an index tensor on `device`, built once: an index list makes a new
    tensor and a host-to-device copy (a sync on a GPU) at every decoding step."""
    columns = [i for i in ids if 0 <= i < vocab]
    return torch.tensor(columns, dtype=torch.long, device=device) if columns else None


class HFPlaceholderBan(LogitsProcessor):
    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return ban(scores, self.ids)
