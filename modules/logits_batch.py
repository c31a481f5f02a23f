"""Which request sits at which batch index, and the `BatchUpdate` that tells processors so.

Requests join (`add`) and leave (`remove`) at any time; `flush()`, called once per decoding step,
applies the pending changes the way vLLM's model runner does and returns the `BatchUpdate`
describing them (None when nothing changed):
1. new requests take the slots of finished ones, lowest index first (an add that replaces);
2. more new than finished: the rest are appended at the end;
3. fewer new than finished: the rest of the finished slots are removed, then the batch is made
   contiguous again by one-way moves from the highest occupied slot into the lowest hole;
4. swaps asked for with `swap()` (reordering) come last.
This module knows nothing about models, tensors or processors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from modules.logits_processors import AddedRequest, BatchUpdate, MovedRequest, MoveDirectionality, RequestParams


@dataclass(eq=False)
class Slot:
    """One request in the batch. `index` is None until the flush that adds it, then follows moves."""
    params: RequestParams
    prompt_ids: Optional[list[int]]
    output_ids: list[int] = field(default_factory=list)  # the processors hold this list: extend it in place
    index: Optional[int] = None


class PersistentBatch:
    def __init__(self) -> None:
        self.slots: list[Optional[Slot]] = []  # contiguous after every flush
        self._joining: list[Slot] = []
        self._leaving: set[int] = set()
        self._swaps: list[tuple[int, int]] = []

    @property
    def size(self) -> int:
        return len(self.slots)

    def all_greedy(self) -> bool:
        return all(slot.params.greedy for slot in self.slots if slot is not None)

    def add(self, slot: Slot) -> None:
        if slot.index is not None or slot in self._joining:
            raise ValueError(f"This request is already in the batch (index {slot.index})")
        self._joining.append(slot)

    def remove(self, slot: Slot) -> None:
        if slot.index is None:  # left before any step: the processors never saw it
            self._joining.remove(slot)
            return
        assert self.slots[slot.index] is slot, "a slot's index must follow its position"
        self._leaving.add(slot.index)

    def size_after_flush(self) -> int:
        return len(self.slots) + len(self._joining) - len(self._leaving)

    def swap(self, a: int, b: int) -> None:
        """Exchange two requests at the next flush (indices as they are after its adds and removes)."""
        size = self.size_after_flush()
        if not (0 <= a < size and 0 <= b < size):
            raise ValueError(f"Cannot swap indices {a} and {b}: the batch will hold {size} requests")
        self._swaps.append((a, b))

    def flush(self) -> Optional[BatchUpdate]:
        if not (self._joining or self._leaving or self._swaps):
            return None
        finished = sorted(self._leaving)
        joining = self._joining
        added = [self._put(index, slot) for index, slot in zip(finished, joining)]
        added += [self._put(self._append_index(), slot) for slot in joining[len(finished):]]
        removed = finished[len(joining):]
        for index in removed:
            self.slots[index].index = None
            self.slots[index] = None
        moved = self._condense() + [self._swap(a, b) for a, b in self._swaps]
        self._joining, self._leaving, self._swaps = [], set(), []
        return BatchUpdate(batch_size=len(self.slots), removed=removed, added=added, moved=moved)

    def _append_index(self) -> int:
        self.slots.append(None)
        return len(self.slots) - 1

    def _put(self, index: int, slot: Slot) -> AddedRequest:
        old = self.slots[index]
        if old is not None:
            old.index = None
        self.slots[index] = slot
        slot.index = index
        return AddedRequest(index, slot.params, slot.prompt_ids, slot.output_ids)

    def _condense(self) -> list[MovedRequest]:
        """One-way moves from the highest occupied slot into the lowest hole, then drop the empty tail."""
        moves = []
        holes = [i for i, slot in enumerate(self.slots) if slot is None]
        for hole in holes:
            while self.slots and self.slots[-1] is None:
                self.slots.pop()
            if hole >= len(self.slots):
                break
            source = len(self.slots) - 1
            slot = self.slots.pop()
            self.slots[hole] = slot
            slot.index = hole
            moves.append(MovedRequest(source, hole, MoveDirectionality.UNIDIRECTIONAL))
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        return moves

    def _swap(self, a: int, b: int) -> MovedRequest:
        self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
        self.slots[a].index, self.slots[b].index = a, b
        return MovedRequest(a, b, MoveDirectionality.SWAP)
