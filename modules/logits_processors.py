"""The logits-processor plug-in interface, after vLLM's (`vllm.v1.sample.logits_processor`).

A processor works at batch granularity. The host constructs each loaded class once, at start-up,
with `(config: HostConfig, device, is_pin_memory)`. Then, at every decoding step:
1. `update_state(batch_update)`: the batch changed (`BatchUpdate`), or None when it did not;
2. `apply(logits)`: `(num_requests, vocab)` float logits, row i = the request at batch index i;
   return the transformed tensor (changing it in place is allowed and cheapest).
`is_argmax_invariant()` is read once at start-up: when it is True and every request in the batch is
greedy, `apply` is skipped for that step (`update_state` still runs).

A request switches a processor on through its arguments: `RequestParams.extra_args` holds the
request's `logits_processor_args` (API: `logits_processor_args` or vLLM's `vllm_xargs`; UI and
settings: `state['logits_processor_args']`). A processor no request enabled should return `logits`
unchanged at once.

`AdapterLogitsProcessor` wraps request-level callables `(output_ids, logits_row)` or
`(prompt_ids, output_ids, logits_row)` (vLLM v0 and Hugging Face-style per-request processors).
This module holds the interface only: loading is `modules.logits_processor_loader`, running is
`modules.logits_bridge`, the batch bookkeeping is `modules.logits_batch`.
"""
from __future__ import annotations

import argparse
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import torch


@dataclass(frozen=True)
class HostConfig:
    """What every processor is constructed with (vLLM: `VllmConfig`); fixed after start-up."""
    args: argparse.Namespace  # the parsed command line
    settings: Mapping[str, Any]  # the generation settings (`shared.settings`)
    model_config: Any = None  # the loaded model's transformers config, or None without a model
    tokenizer: Any = None  # the loaded tokenizer, or None


@dataclass(frozen=True)
class RequestParams:
    """A request's parameters as processors see them (vLLM: `SamplingParams`)."""
    extra_args: Optional[dict[str, Any]] = None  # the request's logits_processor_args; None when it sent none
    greedy: bool = True  # decoded by argmax (temperature 0 or do_sample off)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 0


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # a -> b; a is left empty
    SWAP = auto()  # a <-> b


class AddedRequest(NamedTuple):
    index: int  # the batch index at the time of the add, before this update's moves
    params: RequestParams
    prompt_tok_ids: Optional[list[int]]  # the prompt (image placeholder ids included)
    output_tok_ids: list[int]  # grows in place as the request generates


class MovedRequest(NamedTuple):
    a: int
    b: int
    direction: MoveDirectionality


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch changed since the last step. Apply in this order: removes, adds, moves.

    An add at an index that held a request replaces it (that request finished: forget it). Moves
    apply in list order, after the adds and removes. `batch_size` counts the slots after the update.
    """
    batch_size: int
    removed: Sequence[int] = ()
    added: Sequence[AddedRequest] = ()
    moved: Sequence[MovedRequest] = ()


class LogitsProcessor(ABC):
    """The base class of every batch-level processor (see the module docstring for the contract)."""

    @abstractmethod
    def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool) -> None:
        ...

    @classmethod
    def validate_params(cls, params: RequestParams) -> None:
        """Raise ValueError for request arguments this processor cannot use (the request fails with 400)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`(num_requests, vocab)` logits -> the same shape, transformed for the requests that enable it."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when this processor never changes which token has the highest logit."""

    @abstractmethod
    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        """Follow the batch: removes, then adds, then moves (None: nothing changed)."""


RequestLogitsProcessor = Union[
    Callable[[list[int], torch.Tensor], torch.Tensor],  # (output ids, logits row) -> logits row
    Callable[[list[int], list[int], torch.Tensor], torch.Tensor],  # (prompt ids, output ids, logits row)
]


class _RequestState(NamedTuple):
    processor: RequestLogitsProcessor
    prompt_ids: Optional[list[int]]
    output_ids: list[int]
    takes_prompt: bool


class AdapterLogitsProcessor(LogitsProcessor):
    """Runs a request-level processor per enabled request, row by row.

    Subclasses implement `new_req_logits_processor(params)` (None: not for this request) and
    `is_argmax_invariant()`. The state is sparse: only enabled requests have an entry.
    """

    def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.config = config
        self.device = device
        self.is_pin_memory = is_pin_memory
        self.req_info: dict[int, _RequestState] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: RequestParams) -> Optional[RequestLogitsProcessor]:
        """A request-level processor for this request, or None to leave the request alone."""

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            processor = self.new_req_logits_processor(params)
            if processor is None:
                self.req_info.pop(index, None)  # the request this replaced is gone
            else:
                self.req_info[index] = _RequestState(processor, prompt_ids, output_ids, takes_prompt(processor))
        if self.req_info:
            apply_moves(self.req_info, batch_update.moved)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, state in self.req_info.items():
            row = logits[index]
            if state.takes_prompt:
                logits[index] = state.processor(state.prompt_ids or [], state.output_ids, row)
            else:
                logits[index] = state.processor(state.output_ids, row)
        return logits


def takes_prompt(processor: Callable) -> bool:
    """Request-level processors with three parameters get the prompt ids first."""
    parameters = inspect.signature(processor).parameters.values()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 3


def apply_moves(per_index: dict[int, Any], moved: Sequence[MovedRequest]) -> None:
    """Move a sparse `{batch index: state}` along `moved`, in order (one-way moves and swaps)."""
    for a, b, direction in moved:
        a_value = per_index.pop(a, None)
        b_value = per_index.pop(b, None)
        if a_value is not None:
            per_index[b] = a_value
        if direction == MoveDirectionality.SWAP and b_value is not None:
            per_index[a] = b_value
