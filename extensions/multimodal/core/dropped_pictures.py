"""Naming the pictures that were left out to fit the context: their turn, and their place in it.

Truncation drops the prompt's leading pictures (`prompt_encoding`). The prompt holds the pictures of
the history's turns it kept, in order, then the new message's: each dropped picture is matched, in
order, to the next such picture with the same data; one found in no kept turn belongs to the new message.
The turns kept are those after the ones the host left out whole: this repository's host says how many
in `state[HOST_DROPPED_TURNS]`; text-generation-webui says nothing, and every turn counts.
"""
from __future__ import annotations

from typing import List

from extensions.multimodal.core.image_codec import find_tags

HOST_DROPPED_TURNS = "dropped_turns"  # the host's modules/chat.py DROPPED_TURNS (tests/test_image_budget.py)


def history_turns(state: dict) -> list:
    history = state.get("history")
    return list(history.get("internal", [])) if isinstance(history, dict) else []


def history_pictures(state: dict) -> List[tuple[int, int, str]]:
    """(turn, place in the turn, base64 data) of every picture in the user messages of the history's
    turns the prompt kept, 1-based."""
    internal = history_turns(state)
    kept_from = int(state.get(HOST_DROPPED_TURNS) or 0)
    found = []
    for turn, exchange in enumerate(internal[kept_from:], start=kept_from + 1):
        user = exchange[0] if exchange else ""
        for place, tag in enumerate(find_tags(str(user or "")), start=1):
            found.append((turn, place, tag.data))
    return found


def locate(dropped: List[str], state: dict) -> List[dict]:
    """Per dropped picture (its base64 data, prompt order): `{"turn": n, "image": k}`."""
    pictures, position, located = history_pictures(state), 0, []
    new_turn = len(history_turns(state)) + 1
    for data in dropped:
        while position < len(pictures) and pictures[position][2] != data:
            position += 1
        if position < len(pictures):
            located.append({"turn": pictures[position][0], "image": pictures[position][1]})
            position += 1
        else:
            located.append({"turn": new_turn, "image": 1 + sum(1 for p in located if p["turn"] == new_turn)})
    return located


def describe(located: List[dict]) -> str:
    """"the picture from turn 2", "the pictures from turns 1 and 3" ..."""
    turns = sorted({entry["turn"] for entry in located})
    names = ", ".join(map(str, turns[:-1])) + (" and " if len(turns) > 1 else "") + str(turns[-1])
    if len(located) == 1:
        return f"the picture from turn {turns[0]}"
    return f"the {len(located)} pictures from turn{'s' if len(turns) > 1 else ''} {names}"
