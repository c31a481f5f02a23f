"""A chat longer than its context: what building one turn's prompt costs as the history grows.

Text-generation-webui drops the oldest turns until the prompt fits, and each try renders the chat
template over the whole remaining history and measures the result. This runs `chat.generate_chat_prompt`
(the host's, as `server.py` loads it, the multimodal extension measuring) on the shipped demo model
(`models/tiny-llava-shapes`, its string template) with text histories of 50, 200 and 1000 turns,
`truncation_length` 2048 and `max_new_tokens` 256, so about 24 turns fit. It prints per length the best
of 3 times, the renders one turn's prompt took (counted at `chat.render_messages`) and the turns kept,
then the ratio of the 1000-turn time to the 50-turn one: how the cost grows with the history.

    python bench/long_chat.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.picture_once import machine  # noqa: E402
from fixtures import host_helpers  # noqa: E402
from modules import chat  # noqa: E402

LENGTHS = (50, 200, 1000)


def history_of(turns: int) -> dict:
    internal = [[f"Question number {i}: what colour was the shape in the picture before, and why?",
                 f"Answer number {i}: it was red, as the one before it."] for i in range(turns)]
    return {"internal": internal, "visible": [list(turn) for turn in internal]}


def one_length(turns: int, renders: list) -> dict:
    state = host_helpers.greedy_state(history=history_of(turns), truncation_length=2048, max_new_tokens=256)
    times = []
    for _ in range(3):
        renders.clear()
        started = time.perf_counter()
        prompt = chat.generate_chat_prompt("And now?", state)
        times.append(time.perf_counter() - started)
    return {"turns": turns, "ms": round(min(times) * 1000, 1), "renders": len(renders),
            "kept": prompt.count("Question number")}


def main() -> None:
    host_helpers.load(str(ROOT / "models" / "tiny-llava-shapes"), ["multimodal"])
    renders, render = [], chat.render_messages
    chat.render_messages = lambda *args, **kwargs: renders.append(1) or render(*args, **kwargs)
    rows = [one_length(turns, renders) for turns in LENGTHS]
    print("history turns | prompt ms | renders | turns kept")
    for row in rows:
        print(f"{row['turns']} | {row['ms']} | {row['renders']} | {row['kept']}")
    print(json.dumps({"rows": rows, "ms_1000_over_50": round(rows[-1]["ms"] / rows[0]["ms"], 1),
                      "machine": machine()}))


if __name__ == "__main__":
    main()
