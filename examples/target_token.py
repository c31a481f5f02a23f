"""The target-token logits processor (vLLM's `DummyLogitsProcessor`), in both styles.

A request that sends the argument `target_token` (a token id) gets every logit but that token's
masked to -inf, so it generates only that token; other requests are left alone.
- `TargetTokenLogitsProcessor`: batch-level, with a sparse `{batch index: token id}` state.
- `TargetTokenAdapterProcessor`: the same rule as a request-level callable wrapped by
  `AdapterLogitsProcessor`.
Load one with `--logits-processors examples.target_token:TargetTokenLogitsProcessor`, then send
`"logits_processor_args": {"target_token": 67}` with an API request (README.md, "Logits processors").
"""
from __future__ import annotations

from typing import Optional

import torch

from modules.logits_processors import (AdapterLogitsProcessor, BatchUpdate, HostConfig, LogitsProcessor,
                                       RequestLogitsProcessor, RequestParams, apply_moves)


def target_of(params: RequestParams, arg_name: str) -> Optional[int]:
    """The request's target token id, or None when it sent none."""
    return (params.extra_args or {}).get(arg_name)


def check_target(params: RequestParams, arg_name: str) -> None:
    target = target_of(params, arg_name)
    if target is not None and (isinstance(target, bool) or not isinstance(target, int) or target < 0):
        raise ValueError(f"{arg_name} must be a token id (an integer of 0 or more), got {target!r}")


class TargetTokenLogitsProcessor(LogitsProcessor):
    arg_name = "target_token"  # the request argument that switches it on

    def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool):
        self.req_info: dict[int, int] = {}  # batch index -> target token id, enabled requests only

    @classmethod
    def validate_params(cls, params: RequestParams) -> None:
        check_target(params, cls.arg_name)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, _, _ in batch_update.added:
            target = target_of(params, self.arg_name)
            if target is None:
                self.req_info.pop(index, None)  # an add replaces whatever request held the index
            else:
                self.req_info[index] = target
        if self.req_info:
            apply_moves(self.req_info, batch_update.moved)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits  # no request asked: nothing to do
        rows = torch.tensor(list(self.req_info.keys()), dtype=torch.long, device=logits.device)
        cols = torch.tensor(list(self.req_info.values()), dtype=torch.long, device=logits.device)
        keep = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = keep
        return logits


class TargetToken:
    """The request-level rule: `(output_ids, logits_row) -> logits_row` keeping only `target`."""

    def __init__(self, target: int):
        self.target = target

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        keep = logits[self.target].clone()
        logits[:] = float("-inf")
        logits[self.target] = keep
        return logits


class TargetTokenAdapterProcessor(AdapterLogitsProcessor):
    arg_name = "target_token"

    def is_argmax_invariant(self) -> bool:
        return False

    @classmethod
    def validate_params(cls, params: RequestParams) -> None:
        check_target(params, cls.arg_name)

    def new_req_logits_processor(self, params: RequestParams) -> Optional[RequestLogitsProcessor]:
        target = target_of(params, self.arg_name)
        return None if target is None else TargetToken(target)
