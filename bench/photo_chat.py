"""A chat that keeps phone photos: what each later turn costs, beside the same chat with small pictures.

The history keeps every picture as sent, so a chat with phone photos carries megabytes of base64
per picture into every later prompt. This runs one chat per picture size through this repository's
host (`chat.generate_chat_reply`, the multimodal extension loaded as `server.py` loads it): four
turns, each with a new photo-like JPEG, then four text-only turns, and prints per turn the time to
the first token (TTFT) and the decodes and processor runs it did (counted by wrappers around the
product's functions, as bench/picture_once.py counts them). After its turn, a picture should be
neither decoded nor processed again: its ids and its embedding are kept (`embedding_cache_mb`).

The model: llava-hf with LLaVA-1.5's real CLIP-336 processor, a tiny tower and language model
(bench/picture_once.py's), random weights, 4 greedy new tokens a turn; its chat template a string
template, or with `--hub-template` llava-hf's own as on the hub, which takes content only as typed
parts (the host then renders each picture as an image part). Pictures: 640x480 and 4032x3024 (a 12 MP
phone camera's), quality 90.

    python bench/photo_chat.py                   # medians of 3 chats per size
    python bench/photo_chat.py --hub-template    # the same with llava-hf's own chat template
    python bench/photo_chat.py --api             # through /v1/chat/completions (below)
    python bench/photo_chat.py --smoke           # one chat per size

`--api` sends each turn as an OpenAI-style client does: one streamed request carrying the whole
conversation, every picture as a data URL again (three picture turns: four phone photos pass the API's
20 MiB body cap). The TTFT is the first chunk with text, timed by the `openai` client in this process,
so the client's encoding of the request counts, as it does for a user.

Prints a table and one JSON object; the ratio is the text turns' TTFT with phone photos over small.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.picture_once import Counter, build_llava, machine, photo_jpeg  # noqa: E402
from fixtures import api_helpers, host_helpers, tiny_models, vlm_families  # noqa: E402
from modules import chat  # noqa: E402

SIZES = {"small": (640, 480), "phone": (4032, 3024)}
PICTURE_TURNS, TEXT_TURNS = 4, 4
API_PICTURE_TURNS = 3  # a fourth phone photo would take the request past the API's body cap


def turn(history: dict, text: str, images: list) -> tuple[float, dict]:
    """(TTFT, history after the turn) for one greedy turn through the host's chat."""
    state = host_helpers.greedy_state(history=history, max_new_tokens=4, ban_eos_token=True, truncation_length=8192,
                                      message_images=images or None)
    started, first, latest = time.perf_counter(), None, history
    for latest in chat.generate_chat_reply(text, state, loading_message=False):
        first = first if first is not None else time.perf_counter() - started
    return first, latest


def api_turn(client, messages: list, text: str, images: list) -> tuple[float, list]:
    """(TTFT, messages after the turn) for one greedy streamed request carrying the whole conversation."""
    pictures = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(p, "image/jpeg")}} for p in images]
    messages = messages + [{"role": "user", "content": pictures + [{"type": "text", "text": text}]}]
    started, first, reply = time.perf_counter(), None, ""
    for chunk in client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0,
                                                stream=True, extra_body={"ban_eos_token": True, "truncation_length": 8192}):
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            first = first if first is not None else time.perf_counter() - started
            reply += text
    return first, messages + [{"role": "assistant", "content": reply}]


def one_chat(size: tuple[int, int], seed: int, counter: Counter, client=None) -> list[dict]:
    """Per turn: TTFT and the decodes and processor runs it did (through the API when given a client)."""
    conversation, rows = ([] if client else chat.new_history()), []
    picture_turns = API_PICTURE_TURNS if client else PICTURE_TURNS
    for index in range(picture_turns + TEXT_TURNS):
        images = [photo_jpeg(size, seed + index)] if index < picture_turns else []
        text = f"What is in picture {index + 1}?" if images else "And then?"
        counter.reset()
        if client:
            ttft, conversation = api_turn(client, conversation, text, images)
        else:
            ttft, conversation = turn(conversation, text, images)
        rows.append({"picture": bool(images), "ttft_s": ttft, **counter.counts})
    return rows


def medians(chats: list[list[dict]]) -> list[dict]:
    return [{"picture": turns[0]["picture"], **{key: statistics.median(t[key] for t in turns)
                                                for key in ("ttft_s", "decodes", "processor runs")}}
            for turns in zip(*chats)]


def print_turns(results: dict, columns: str, key: str, cell) -> dict:
    """Prints one row per turn, the chats side by side (`cell(row)` each); returns per chat the median of
    `key` over its text turns."""
    print("turn | " + " | ".join(f"{name}: {columns}" for name in results))
    for index, rows in enumerate(zip(*results.values())):
        print(f"{index + 1}{' (picture)' if rows[0]['picture'] else ''} | " + " | ".join(cell(row) for row in rows))
    return {name: statistics.median(row[key] for row in rows if not row["picture"]) for name, rows in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one chat per size")
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--hub-template", action="store_true", help="llava-hf's own chat template (typed parts)")
    parser.add_argument("--api", action="store_true", help="each turn a request to /v1/chat/completions")
    args = parser.parse_args()
    chats = 1 if args.smoke else args.chats
    with tempfile.TemporaryDirectory() as tmp:
        saved = host_helpers.snapshot()
        try:
            template = vlm_families.hub_template("llava") if args.hub_template else tiny_models.CHAT_TEMPLATE
            host_helpers.load(build_llava(Path(tmp) / "llava", template), ["multimodal"])
            api = api_helpers.start_api() if args.api else None
            client = api.client() if api else None
            counter = Counter()
            turn(chat.new_history(), "Warm up.", [photo_jpeg((64, 48), 1)])
            results = {name: medians([one_chat(size, 100 * c, counter, client) for c in range(chats)])
                       for name, size in SIZES.items()}
            if api:
                api.stop()
        finally:
            host_helpers.restore(saved)
    text = print_turns(results, "TTFT ms, decodes, processor runs", "ttft_s",
                       lambda row: f"{row['ttft_s'] * 1000:.1f}, {row['decodes']:g}, {row['processor runs']:g}")
    print(json.dumps({"text_turn_ttft_ms": {name: round(value * 1000, 1) for name, value in text.items()},
                      "phone_over_small": round(text["phone"] / text["small"], 1), "chats": chats,
                      "model": "llava-hf, CLIP-336 processor, tiny",
                      "chat_template": "llava-hf's own" if args.hub_template else "string",
                      "through": "the API" if args.api else "the host's chat turn", "machine": machine(),
                      "turns": {name: rows for name, rows in results.items()}}))


if __name__ == "__main__":
    main()
