"""What docs/SCALING.md measures on this machine: two hosts in front of one vLLM, and vLLM's prefix cache.

    python bench/scaling.py [--chats 8] [--tokens 64] [--turns 8] [--rounds 3]

1. Two hosts, one vLLM: N chats with pictures sent at once, all through one host, then split over
   two hosts on the same vLLM (`--engine-url` alike), alternating, best of the rounds.
2. Prefix caching on repeated pictures: a chat of T turns, each with a new picture, asked once more
   (the same history and pictures, a new last question), on a vLLM with its prefix cache (the
   default) and on one started with `--no-enable-prefix-caching`. Prints the time to the first token
   of that last request, and the ratio. The host is the same; only vLLM's cache differs.
Everything runs on this machine (vLLM's CPU build, tools/vllm_cpu/install.sh first).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_concurrency import one_chat, picture_url  # noqa: E402
from tools.vllm_cpu.process import host_server, vllm_server  # noqa: E402

LOGS = Path(__file__).resolve().parent / "out" / "scaling"


def split_burst(urls: list[str], chats: int, tokens: int, seed: int) -> float:
    """Reply tokens per second for `chats` sent at once, dealt over `urls` in turn."""
    jobs = [(urls[i % len(urls)], picture_url(seed + i)) for i in range(chats)]
    started = time.perf_counter()
    with ThreadPoolExecutor(chats) as pool:
        results = list(pool.map(lambda job: one_chat(job[0], job[1], tokens), jobs))
    return sum(r[2] for r in results) / (time.perf_counter() - started)


def two_hosts(chats: int, tokens: int, rounds: int) -> None:
    with vllm_server(LOGS / "vllm.log") as vllm, \
            host_server(["--engine-url", vllm.url], LOGS / "host-a.log") as a, \
            host_server(["--engine-url", vllm.url], LOGS / "host-b.log") as b:
        layouts = {"one host": [a.url], "two hosts": [a.url, b.url]}
        for urls in layouts.values():
            split_burst(urls, 2, 8, seed=0)  # warm
        best = {name: 0.0 for name in layouts}
        for round_ in range(rounds):
            order = list(layouts.items()) if round_ % 2 == 0 else list(layouts.items())[::-1]
            for name, urls in order:
                best[name] = max(best[name], split_burst(urls, chats, tokens, seed=100 * round_))
    print(f"\n{chats} chats at once, {tokens} reply tokens each, one vLLM; best of {rounds} rounds")
    print("| hosts | reply tokens/s |\n|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:.0f} |")
    print(f"| **two / one** | **{best['two hosts'] / best['one host']:.2f}** |")


def long_chat(turns: int) -> list[dict]:
    messages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture_url(7 + turn)}},
                                                     {"type": "text", "text": "Describe the image."}]})
        messages.append({"role": "assistant", "content": "A red circle in the center."})
    return messages


def first_token_seconds(url: str, messages: list[dict]) -> float:
    import httpx

    body = {"messages": messages, "temperature": 0, "max_tokens": 1, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content": "' in line and '"content": ""' not in line:
                return time.perf_counter() - started
    return time.perf_counter() - started


def prefix_caching(turns: int, rounds: int) -> None:
    history = long_chat(turns)
    results = {}
    for name, extra in (("prefix cache on (default)", ()), ("--no-enable-prefix-caching", ("--no-enable-prefix-caching",))):
        with vllm_server(LOGS / f"vllm-{len(extra)}.log", extra=extra) as vllm, \
                host_server(["--engine-url", vllm.url], LOGS / f"host-{len(extra)}.log") as host:
            first_token_seconds(host.url, history + [{"role": "user", "content": "How many shapes are there?"}])
            asks = [first_token_seconds(host.url, history + [{"role": "user", "content": f"Is there a blue shape? ({i})"}])
                    for i in range(rounds)]
            results[name] = statistics.median(asks)
    on, off = results.values()
    print(f"\nA {turns}-turn chat, a new picture each turn, asked again (median of {rounds}); seconds to the first token")
    print("| vLLM | TTFT s |\n|---|---|")
    for name, seconds in results.items():
        print(f"| {name} | {seconds:.3f} |")
    print(f"| **on / off** | **{on / off:.2f}** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    two_hosts(args.chats, args.tokens, args.rounds)
    prefix_caching(args.turns, args.rounds)


if __name__ == "__main__":
    main()
