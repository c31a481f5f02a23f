"""Batch bookkeeping: the `BatchUpdate`s the host builds and the processors' views of the batch.

The oracle is the persistent batch itself: after every step, each processor's per-index state must
name exactly the requests the batch holds at those indices. Scripted steps pin the seed's rules
(adds replace finished requests lowest index first, extra adds append, leftover removes condense
by one-way moves from the top, swaps come last); a Hypothesis run checks random sequences.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.target_token import TargetTokenAdapterProcessor, TargetTokenLogitsProcessor
from modules import shared
from modules.logits_batch import PersistentBatch, Slot
from modules.logits_bridge import LogitsProcessorError, LogitsProcessorRunner
from modules.logits_processors import (AddedRequest, BatchUpdate, HostConfig, LogitsProcessor, MovedRequest,
                                       MoveDirectionality, RequestParams)

UNI, SWAP = MoveDirectionality.UNIDIRECTIONAL, MoveDirectionality.SWAP
CONFIG = HostConfig(args=shared.parse_args([]), settings={})
CPU = torch.device("cpu")


class Recording(LogitsProcessor):
    """Keeps a dense list of request names per batch index, following the contract to the letter."""

    def __init__(self, config: HostConfig, device: torch.device, is_pin_memory: bool):
        self.names: list[Optional[str]] = []
        self.updates: list[Optional[BatchUpdate]] = []
        self.applied: list[list[float]] = []  # per apply: column 0 of each row, in batch order

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        self.updates.append(batch_update)
        if batch_update is None:
            return
        grow = max([batch_update.batch_size, len(self.names)] + [a.index + 1 for a in batch_update.added])
        self.names += [None] * (grow - len(self.names))
        for index in batch_update.removed:
            self.names[index] = None
        for index, params, _, _ in batch_update.added:
            self.names[index] = params.extra_args["name"]
        for a, b, direction in batch_update.moved:
            if direction == SWAP:
                self.names[a], self.names[b] = self.names[b], self.names[a]
            else:
                self.names[b], self.names[a] = self.names[a], None
        assert all(n is None for n in self.names[batch_update.batch_size:]), "slots past batch_size must be empty"
        del self.names[batch_update.batch_size:]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.applied.append(logits[:, 0].tolist())
        return logits


def request(name: str, target: Optional[int] = None) -> Slot:
    args = {"name": name} if target is None else {"name": name, "target_token": target}
    return Slot(RequestParams(extra_args=args), prompt_ids=[1, 2])


class Harness:
    """A batch plus one processor of each kind, stepped together."""

    def __init__(self):
        self.batch = PersistentBatch()
        self.recording = Recording(CONFIG, CPU, False)
        self.sparse = TargetTokenLogitsProcessor(CONFIG, CPU, False)
        self.adapter = TargetTokenAdapterProcessor(CONFIG, CPU, False)
        self.by_name: dict[str, Slot] = {}

    def add(self, name: str, target: Optional[int] = None) -> None:
        self.by_name[name] = request(name, target)
        self.batch.add(self.by_name[name])

    def remove(self, name: str) -> None:
        self.batch.remove(self.by_name[name])

    def step(self) -> Optional[BatchUpdate]:
        update = self.batch.flush()
        for processor in (self.recording, self.sparse, self.adapter):
            processor.update_state(update)
        self.check_views()
        return update

    def check_views(self) -> None:
        held = [slot.params.extra_args["name"] for slot in self.batch.slots]
        assert self.recording.names == held
        assert [slot.index for slot in self.batch.slots] == list(range(len(held)))
        targets = {i: slot.params.extra_args["target_token"] for i, slot in enumerate(self.batch.slots)
                   if "target_token" in slot.params.extra_args}
        assert self.sparse.req_info == targets
        assert {i: state.processor.target for i, state in self.adapter.req_info.items()} == targets


def names(update: BatchUpdate) -> list[tuple[int, str]]:
    return [(a.index, a.params.extra_args["name"]) for a in update.added]


def test_scripted_adds_removes_moves_and_swaps_follow_the_seed_rules():
    h = Harness()
    for name, target in [("A", 5), ("B", None), ("C", 7), ("D", 9)]:
        h.add(name, target)
    update = h.step()
    assert (update.batch_size, names(update), list(update.removed), list(update.moved)) == (
        4, [(0, "A"), (1, "B"), (2, "C"), (3, "D")], [], [])

    # Two finish, one joins: the newcomer takes the lowest finished slot; the other is removed.
    h.remove("D"), h.remove("B"), h.add("E", 11)
    update = h.step()
    assert (update.batch_size, names(update), list(update.removed), list(update.moved)) == (3, [(1, "E")], [3], [])

    # Two finish below a survivor: it moves down into the lowest hole (one-way), the batch shrinks.
    h.remove("A"), h.remove("E")
    update = h.step()
    assert (update.batch_size, names(update), list(update.removed), list(update.moved)) == (
        1, [], [0, 1], [MovedRequest(2, 0, UNI)])

    # Adds append; a swap applies after them (G is added at 2, then swapped to 0).
    h.add("F"), h.add("G", 13), h.add("H", 15)
    h.batch.swap(0, 2)
    update = h.step()
    assert (update.batch_size, names(update), list(update.moved)) == (
        4, [(1, "F"), (2, "G"), (3, "H")], [MovedRequest(0, 2, SWAP)])
    assert h.sparse.req_info == {0: 13, 2: 7, 3: 15}

    assert h.step() is None  # nothing changed

    h.remove("F"), h.remove("C"), h.add("I", 17)
    update = h.step()
    assert (names(update), list(update.removed), list(update.moved)) == ([(1, "I")], [2], [MovedRequest(3, 2, UNI)])

    h.batch.swap(0, 1), h.batch.swap(1, 2)
    update = h.step()
    assert (names(update), list(update.moved)) == ([], [MovedRequest(0, 1, SWAP), MovedRequest(1, 2, SWAP)])
    assert [slot.params.extra_args["name"] for slot in h.batch.slots] == ["I", "H", "G"]


def test_an_add_that_replaces_a_finished_request_clears_its_state():
    h = Harness()
    h.add("A", 5)
    h.step()
    h.remove("A"), h.add("B")  # B asks for nothing: A's target must not stick to index 0
    update = h.step()
    assert names(update) == [(0, "B")] and list(update.removed) == []
    assert h.sparse.req_info == {} and h.adapter.req_info == {}


def test_a_request_that_leaves_before_any_step_is_never_seen():
    h = Harness()
    h.add("A", 5)
    h.remove("A")
    assert h.step() is None and h.recording.names == []


def test_hand_written_update_add_then_swap_keys_the_add_before_the_move():
    """The seed's example: added at 5 and swapped with 3 -> the request is at 3 afterwards."""
    processor = TargetTokenLogitsProcessor(CONFIG, CPU, False)
    def added(index: int, target: int) -> AddedRequest:
        return AddedRequest(index, RequestParams(extra_args={"target_token": target}), None, [])

    processor.update_state(BatchUpdate(batch_size=6, added=[added(i, 40 + i) for i in range(6)]))
    processor.update_state(BatchUpdate(batch_size=6, added=[added(5, 99)], moved=[MovedRequest(5, 3, SWAP)]))
    assert processor.req_info == {0: 40, 1: 41, 2: 42, 3: 99, 4: 44, 5: 43}


OPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "swap", "step"]), st.integers(0, 50), st.booleans()),
               max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_sequences_keep_every_processor_view_exact(ops):
    h, counter = Harness(), 0
    for op, number, enabled in ops:
        if op == "add":
            counter += 1
            h.add(f"r{counter}", number if enabled else None)
        elif op == "remove" and h.by_name:  # in the batch, or still joining (never stepped)
            name = sorted(h.by_name)[number % len(h.by_name)]
            h.remove(name)
            del h.by_name[name]
        elif op == "swap" and h.batch.size_after_flush() >= 2:  # reordering is decided at a step, with its adds/removes
            size = h.batch.size_after_flush()
            h.batch.swap(number % size, (number // 7) % size)
            check_update_shape(h.step())
        else:
            update = h.step()
            if update is not None:
                check_update_shape(update)
    h.step()


def check_update_shape(update: BatchUpdate) -> None:
    """With removes, every add replaced a lower finished slot; one-way moves go from a higher to a lower index."""
    if update.removed:
        assert max((a.index for a in update.added), default=-1) < min(update.removed)
    for a, b, direction in update.moved:
        assert direction == SWAP or a > b


# -- The runner: processor order, batch order, failures ---------------------------------------

def test_logits_reach_processors_in_batch_order_and_return_in_row_order():
    recording = Recording(CONFIG, CPU, False)
    target = TargetTokenLogitsProcessor(CONFIG, CPU, False)
    runner = LogitsProcessorRunner([recording, target])
    args = [{"name": "a"}, {"name": "b", "target_token": 3}, {"name": "c"}]
    requests = [(RequestParams(extra_args=a), [1]) for a in args]
    with runner.session(requests) as bridge:
        scores = torch.tensor([[0.0, 1, 2, 0], [10.0, 1, 2, 0], [20.0, 1, 2, 0]])  # column 0 names the row
        out = bridge(torch.zeros((3, 1), dtype=torch.long), scores.clone())
        assert recording.applied[-1] == [0.0, 10.0, 20.0]
        assert out[1].tolist() == [float("-inf")] * 3 + [0.0] and out[0].tolist() == [0.0, 1, 2, 0]
        runner.batch.swap(0, 1)  # reorder: row 1 ("b") now sits at batch index 0
        out = bridge(torch.tensor([[1, 5], [1, 6], [1, 7]]), scores.clone())
        assert recording.applied[-1] == [10.0, 0.0, 20.0]
        assert out[1].tolist() == [float("-inf")] * 3 + [0.0], "the target stays with its request after the swap"
        assert out[0].tolist() == [0.0, 1, 2, 0] and out[2].tolist() == [20.0, 1, 2, 0]
        assert [s.output_ids for s in bridge.slots] == [[5], [6], [7]]
    assert list(runner.batch.flush().removed) == [0, 1, 2] and runner.batch.size == 0


class FailsOnArg(LogitsProcessor):
    def __init__(self, config, device, is_pin_memory):
        self.failing: set[int] = set()
        self.where = "apply"

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for index, params, _, _ in batch_update.added:
            self.failing.discard(index)
            where = (params.extra_args or {}).get("fail")
            if where == "update_state":
                raise KeyError("cannot take this request")
            if where == "apply":
                self.failing.add(index)

    def apply(self, logits):
        if self.failing:
            raise ZeroDivisionError("boom")
        return logits


@pytest.mark.parametrize("where", ["apply", "update_state"])
def test_a_failing_processor_names_itself_and_the_others_keep_their_view(where):
    failing, target = FailsOnArg(CONFIG, CPU, False), TargetTokenLogitsProcessor(CONFIG, CPU, False)
    runner = LogitsProcessorRunner([failing, target])
    scores = torch.zeros((1, 4))
    with pytest.raises(LogitsProcessorError, match=f"FailsOnArg failed in {where}\\(\\)"):
        with runner.session([(RequestParams(extra_args={"fail": where, "target_token": 2}), [1])]) as bridge:
            bridge(torch.zeros((1, 1), dtype=torch.long), scores.clone())
    assert target.req_info == {0: 2}, "the processor after the failing one still saw the add"
    with runner.session([(RequestParams(extra_args=None), [1])]) as bridge:
        out = bridge(torch.zeros((1, 1), dtype=torch.long), scores.clone())
    assert out.tolist() == scores.tolist() and target.req_info == {} and failing.failing == set()


def test_a_processor_returning_the_wrong_shape_is_named():
    class Bad(Recording):
        def apply(self, logits):
            return logits[:, :2]

    runner = LogitsProcessorRunner([Bad(CONFIG, CPU, False)])
    with pytest.raises(LogitsProcessorError, match=r"Bad: apply\(\) returned \(1, 2\); expected .*\(1, 4\)"):
        with runner.session([(RequestParams(extra_args={"name": "a"}), [1])]) as bridge:
            bridge(torch.zeros((1, 1), dtype=torch.long), torch.zeros((1, 4)))
