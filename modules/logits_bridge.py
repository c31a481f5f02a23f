"""Running the loaded batch-level logits processors inside Hugging Face `generate`.

`LogitsProcessorRunner` owns the processors constructed at start-up and the persistent batch.
`session(requests)` puts one `generate` call's requests (one per row of its batch) into the batch
and yields `BatchBridge`, a `transformers.LogitsProcessor` to pass to `generate`; leaving the `with`
block takes them out again. At every step the bridge:
1. appends the tokens generated since the last step to each request's output ids;
2. flushes the batch into one `BatchUpdate` and hands it to every processor's `update_state`;
3. runs `apply` on the `(num_requests, vocab)` logits in batch-index order, skipping argmax-invariant
   processors when every request is greedy.
A processor that raises fails the step, and so the `generate` call, with a `LogitsProcessorError`
naming it; it stays loaded (the next request's add replaces the failed one in its state).
One `generate` call at a time (the host's generation lock), so the batch is that call's rows.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from transformers import LogitsProcessor as HFLogitsProcessor

from modules.logits_batch import PersistentBatch, Slot
from modules.logits_processors import BatchUpdate, LogitsProcessor, RequestParams


class LogitsProcessorError(RuntimeError):
    """A loaded logits processor raised while a request was generating."""


@dataclass(frozen=True)
class Loaded:
    processor: LogitsProcessor
    name: str  # module:Class, for messages
    argmax_invariant: bool  # read once, at start-up


@dataclass(frozen=True)
class StepPlan:
    rows: list[Slot]  # the bridge's rows it was made for
    order: Optional[list[int]]  # row r sits at batch index order[r]; None: row r is batch index r
    to_batch: Optional[torch.Tensor]  # the rows in batch-index order (None with `order`)
    active: list[Loaded]  # the processors that run: argmax-invariant ones are skipped when all are greedy


def class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class LogitsProcessorRunner:
    def __init__(self, processors: Sequence[LogitsProcessor]):
        self.loaded = [Loaded(p, class_name(type(p)), bool(p.is_argmax_invariant())) for p in processors]
        self.batch = PersistentBatch()
        self._in_session = False
        self._plan: Optional[StepPlan] = None

    @property
    def processors(self) -> list[LogitsProcessor]:
        return [entry.processor for entry in self.loaded]

    def validate(self, params: RequestParams) -> None:
        """Each processor's `validate_params`: a ValueError there is the caller's mistake (API: 400)."""
        for entry in self.loaded:
            type(entry.processor).validate_params(params)

    @contextmanager
    def session(self, requests: Sequence[tuple[RequestParams, Optional[list[int]]]]) -> Iterator[BatchBridge]:
        """`requests`: (params, prompt ids) per row of the `generate` batch, in row order."""
        if self._in_session:
            raise RuntimeError("Logits processors run one generate call at a time; another one is running")
        for params, _ in requests:
            self.validate(params)
        slots = [Slot(params, prompt_ids) for params, prompt_ids in requests]
        for slot in slots:
            self.batch.add(slot)
        self._in_session = True
        try:
            yield BatchBridge(self, slots)
        finally:
            for slot in slots:
                self.batch.remove(slot)
            self._in_session = False
            self._plan = None

    def step(self, scores: torch.Tensor, rows: list[Slot]) -> torch.Tensor:
        """`scores` (rows, vocab), row r belonging to `rows[r]` -> the processed scores, same order."""
        update = self.batch.flush()
        self._update_all(update)
        if update is not None or self._plan is None or self._plan.rows is not rows:
            self._plan = self._new_plan(rows)
        plan = self._plan
        logits = scores if plan.order is None else scores[plan.to_batch]  # (num_requests, vocab)
        for entry in plan.active:
            logits = self._apply(entry, logits)
        return logits if plan.order is None else logits[plan.order]

    def _new_plan(self, rows: list[Slot]) -> StepPlan:
        """What a step does while the batch stays as it is (worked out again after each change to it:
        a GPU's compiled step leaves a few microseconds of Python per token to spare)."""
        assert self.batch.size == len(rows), "one generate call at a time: the batch is its rows"
        order = [slot.index for slot in rows]  # row r sits at batch index order[r]
        in_order = order == list(range(len(rows)))
        skip_invariant = self.batch.all_greedy()
        active = [entry for entry in self.loaded if not (skip_invariant and entry.argmax_invariant)]
        return StepPlan(rows, None if in_order else order,
                        None if in_order else torch.argsort(torch.tensor(order)), active)

    def _update_all(self, update: Optional[BatchUpdate]) -> None:
        """Every processor sees every update, even after one of them failed: their views stay exact."""
        failure = None
        for entry in self.loaded:
            try:
                entry.processor.update_state(update)
            except Exception as error:
                failure = failure or (entry, error)
        if failure is not None:
            entry, error = failure
            raise LogitsProcessorError(f"Logits processor {entry.name} failed in update_state(): "
                                       f"{type(error).__name__}: {error}") from error

    def _apply(self, entry: Loaded, logits: torch.Tensor) -> torch.Tensor:
        try:
            result = entry.processor.apply(logits)
        except Exception as error:
            raise LogitsProcessorError(f"Logits processor {entry.name} failed in apply(): "
                                       f"{type(error).__name__}: {error}") from error
        if not isinstance(result, torch.Tensor) or result.shape != logits.shape:
            got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
            raise LogitsProcessorError(f"Logits processor {entry.name}: apply() returned {got}; "
                                       f"expected a tensor of shape {tuple(logits.shape)}")
        return result


class BatchBridge(HFLogitsProcessor):
    """The runner as one Hugging Face logits processor, for one `generate` call."""

    def __init__(self, runner: LogitsProcessorRunner, slots: list[Slot]):
        self.runner = runner
        self.slots = slots
        self.seen: Optional[int] = None  # input_ids columns already accounted for

    def take_tokens(self, tokens: list[int]) -> None:
        """The step's tokens, one per row, from the streamer's host copy (generate makes it anyway): the
        next step then reads no ids off the device, which on a GPU waits for the step's forward before
        the processors can run; a second wait per step, and the logits work after it runs serially."""
        if self.seen is None:
            return  # before the first step: the prompt's length is not known yet
        for slot, token in zip(self.slots, tokens):
            slot.output_ids.append(token)
        self.seen += 1

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.seen is None:
            self.seen = input_ids.shape[1]  # the prompt ids (none for an embeddings prompt)
        elif input_ids.shape[1] > self.seen:
            # Tokens no streamer handed over (`take_tokens`): one small copy from the device.
            new = input_ids[:, self.seen:].tolist()
            self.seen = input_ids.shape[1]
            for slot, ids in zip(self.slots, new):
                slot.output_ids.extend(ids)
        return self.runner.step(scores, self.slots)

    # transformers' LogitsProcessorList asks `inspect.signature` for every processor's arguments at every
    # step; read from the function's source each time, that was about a third of the bridge's cost per
    # token. Given here, it is read once.
    __call__.__signature__ = inspect.signature(__call__)
