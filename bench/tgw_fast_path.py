"""The fast path inside text-generation-webui: a screenshot chat with the extension's caches and without.

Text-generation-webui 1dcde41d's real server (`extensions/multimodal/launch.py --model M --api
--nowebui`, in the harness's overlay of its source, its own Python and pins: transformers 5.6) serves
a Qwen2.5-VL checkpoint with random weights whose vision interface is Qwen2.5-VL-7B's (patch 14,
merge 2, a 1280-wide tower; `--vision-layers` of its 32 blocks, default 1) and the hub's processor
settings, on a tiny language model (bench/image_budget.py builds it). Two servers, each a fresh
process, the same requests, turn by turn in alternation:
- `cached`: the extension as shipped (the image cache, `multimodal-embedding_cache_mb: 256`, and the
  prefix cache, `multimodal-prefix_cache: true`);
- `uncached`: both off (`embedding_cache_mb: 0`, `prefix_cache: false`): every turn every picture
  goes through the tower and the whole prompt is prefilled.
The chat: turns 1-4 each add one 1280x720 screenshot, turn 5 is text only; each turn a streaming,
greedy `/v1/chat/completions` request with the whole conversation (as OpenAI clients send it). The
chat runs `--chats` times (default 2) with other screenshots, each a new chat on the same servers;
the table shows per turn the run whose first token came soonest (the JSON keeps them all).
Per turn: the time to first token (TTFT: from sending the request to the first chunk with text;
text-generation-webui sends an empty role chunk before it generates), the pictures that went through
the vision tower (the extension's log: pictures embedded less those from its cache), the prompt
tokens prefilled, and the reply's text. Per run: the server's peak resident memory (VmHWM).
Then a 20-picture chat on the `cached` settings with the image cache bounded at `--bound-mb`
(default 16 MiB, below the chat's ~24 MiB of features): the largest size the cache reported.

    python bench/tgw_fast_path.py --smoke   # 640x360 screenshots: a couple of minutes
    python bench/tgw_fast_path.py           # the README's table

Run with this repository's venv (it builds the model); text-generation-webui's comes from the harness
(`../shared/tgw/setup_venvs.sh`: /tmp/tgw_venv_head). Prints a table, then one JSON line: TTFT ratios
cached/uncached per turn, tower pictures per turn, peak memory, whether the replies are the same.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.image_budget import build_model, cpu_name, screenshot  # noqa: E402
from fixtures.api_helpers import data_url, free_port  # noqa: E402

HARNESS = Path(os.environ.get("TGW_HARNESS", ROOT.parent / "shared" / "tgw"))
QUESTIONS = ["What does this screenshot show?", "And this one: what changed?", "Where is the error in this one?",
             "Read the selected cell of this one.", "Summarise the four screenshots."]
SETTINGS = {"cached": {"multimodal-embedding_cache_mb": 256, "multimodal-prefix_cache": True},
            "uncached": {"multimodal-embedding_cache_mb": 0, "multimodal-prefix_cache": False}}
EMBEDDED = re.compile(r"Multimodal: embedded (\d+) image\(s\) in [\d.]+ s \((\d+) from\s+cache; it holds ([\d.]+) of")
PREFILLED = re.compile(r"Multimodal: (\d+) prompt tokens prefilled, (\d+) from the")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="640x360 screenshots, 6 pictures in the bound check")
    parser.add_argument("--vision-layers", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--bound-mb", type=int, default=16)
    parser.add_argument("--chats", type=int, default=2,
                        help="the chat this many times, other screenshots each time; per turn the fastest")
    parser.add_argument("--model-dir", type=str, default=None, help="keep the model here (built when missing)")
    parser.add_argument("--tgw-python", default="/tmp/tgw_venv_head/bin/python")
    parser.add_argument("--json-out", type=str, default=None)
    args = parser.parse_args()
    args.picture_size = (640, 360) if args.smoke else (1280, 720)
    args.bound_pictures = 6 if args.smoke else 20
    args.model_dir = Path(args.model_dir or ROOT / "bench" / "out" / f"tgw-qwen2_5_vl-{args.vision_layers}")
    args.json_out = args.json_out or str(ROOT / "bench" / ("out/tgw_fast_path-smoke.json" if args.smoke else
                                                          "results/tgw_fast_path.json"))
    return args


def token_bans(folder: Path) -> str:
    """Ids a random model must not say for its text to show (text-generation-webui withholds text that
    decodes to U+FFFD), as the harness bans them: run_in_tgw.py."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    bans = {i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])}
    return ",".join(str(i) for i in sorted(bans | {i for i in (tokenizer.unk_token_id,) if i is not None}))


class Server:
    """text-generation-webui's server on one model, with `settings`, logging to `log`."""

    def __init__(self, args, column: str, settings: dict):
        sys.path.insert(0, str(HARNESS))
        from run_in_tgw import build_overlay, unpack_tarball

        tree = unpack_tarball(HARNESS / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
        tgw = build_overlay(tree, ROOT / "extensions" / "multimodal", Path(f"/tmp/tgw-bench-{column}"), [])
        (tgw / "user_data" / "settings.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
        self.port, self.log = free_port(), Path(f"/tmp/tgw-bench-{column}.log")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
                   COLUMNS="1000")  # its logger wraps lines at the terminal width
        command = [args.tgw_python, "extensions/multimodal/launch.py", "--model", args.model_dir.name, "--model-dir",
                   str(args.model_dir.parent), "--loader", "Transformers", "--cpu", "--extensions", "multimodal",
                   "--nowebui", "--api", "--api-port", str(self.port)]
        self.process = subprocess.Popen(command, cwd=tgw, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        deadline = time.time() + 600
        while time.time() < deadline and not self.ready():
            if self.process.poll() is not None:
                raise SystemExit(f"text-generation-webui exited: see {self.log}")
            time.sleep(1)

    def ready(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5).read()
            return True
        except OSError:
            return False

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def peak_gb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 2**20

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def ask(server: Server, messages: list, args, bans: str) -> dict:
    """One streaming turn: TTFT, the reply, and what the extension logged for it."""
    body = {"messages": messages, "stream": True, "max_tokens": args.max_new_tokens, "do_sample": False,
            "temperature": 1, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 1, "ban_eos_token": True,
            "custom_token_bans": bans, "mode": "instruct", "truncation_length": 32768}
    seen = len(server.log_lines())
    request = urllib.request.Request(server.url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    started, ttft, reply = time.perf_counter(), None, ""
    with urllib.request.urlopen(request, timeout=3600) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            delta = (json.loads(line[5:]).get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                ttft = ttft if ttft is not None else time.perf_counter() - started
                reply += delta["content"]
    time.sleep(0.5)  # the server logs after the last chunk
    return {"ttft_s": ttft, "reply": reply, **logged(server.log_lines()[seen:])}


def logged(lines: list[str]) -> dict:
    embedded = [EMBEDDED.search(line) for line in lines]
    embedded = [m for m in embedded if m]
    prefilled = [m for m in (PREFILLED.search(line) for line in lines) if m]
    return {"tower_pictures": sum(int(m.group(1)) - int(m.group(2)) for m in embedded),
            "cache_mib": max((float(m.group(3)) for m in embedded), default=0.0),
            "prefilled": sum(int(m.group(1)) for m in prefilled), "reused": sum(int(m.group(2)) for m in prefilled)}


def chat(servers: dict, args, bans: str, pictures: int, questions: list[str], seed: int = 0) -> dict:
    """The chat on each server, turn by turn in alternation (noise from the rest of the machine falls on
    both alike); {column: the turns' results}. `seed` picks the screenshots."""
    messages = {column: [] for column in servers}
    turns = {column: [] for column in servers}
    for turn, question in enumerate(questions):
        content: list = [{"type": "text", "text": question}]
        if turn < pictures:
            url = data_url(screenshot(turn % 4, args.picture_size, seed=seed + turn))
            content.insert(0, {"type": "image_url", "image_url": {"url": url}})
        for column, server in servers.items():
            messages[column].append({"role": "user", "content": content})
            turns[column].append(ask(server, messages[column], args, bans))
            messages[column].append({"role": "assistant", "content": turns[column][-1]["reply"]})
    return turns


def run(args, bans: str) -> dict:
    """Both settings, each in a server of its own, warmed up, then the chat in alternation."""
    servers = {}
    try:
        for column in ("uncached", "cached"):
            servers[column] = Server(args, column, SETTINGS[column])
        warm = [{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": data_url(screenshot(3, (224, 224), seed=99))}}, {"type": "text", "text": "Warm-up."}]}]
        for server in servers.values():
            ask(server, warm, args, bans)
        chats = [chat(servers, args, bans, 4, QUESTIONS, seed=100 * n) for n in range(args.chats)]
        return {column: {"turns": fastest([one[column] for one in chats]), "chats": [one[column] for one in chats],
                         "peak_gb": server.peak_gb()} for column, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


def fastest(chats: list[list[dict]]) -> list[dict]:
    """Per turn, that turn of the chat whose first token came soonest."""
    return [min(turns, key=lambda t: t["ttft_s"]) for turns in zip(*chats)]


def bound_check(args, bans: str) -> dict:
    settings = {**SETTINGS["cached"], "multimodal-embedding_cache_mb": args.bound_mb}
    server = Server(args, "bound", settings)
    try:
        questions = [f"Picture {n + 1}: what is on it?" for n in range(args.bound_pictures)]
        turns = chat({"bound": server}, args, bans, args.bound_pictures, questions)["bound"]
        return {"bound_mb": args.bound_mb, "pictures": args.bound_pictures,
                "largest_cache_mib": max(t["cache_mib"] for t in turns), "peak_gb": server.peak_gb(),
                "tower_pictures": [t["tower_pictures"] for t in turns]}
    finally:
        server.stop()


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def report(runs: dict, bound: dict, args) -> dict:
    cached, uncached = runs["cached"]["turns"], runs["uncached"]["turns"]
    print(f"{cpu_name()}; {args.vision_layers} of 32 vision blocks; screenshots {args.picture_size[0]}x"
          f"{args.picture_size[1]}; text-generation-webui 1dcde41d at its pins (transformers 5.6)")
    print("| turn | TTFT, s: uncached | cached | ratio | tower pictures: uncached | cached | prompt tokens prefilled: "
          "uncached | cached |")
    print("|---|---|---|---|---|---|---|---|")
    for n, (u, c) in enumerate(zip(uncached, cached), start=1):
        print(f"| {n} | {u['ttft_s']:.2f} | {c['ttft_s']:.2f} | {ratio(c['ttft_s'], u['ttft_s'])} | "
              f"{u['tower_pictures']} | {c['tower_pictures']} | {u['prefilled']} | {c['prefilled']} |")
    print(f"peak memory, GiB: uncached {runs['uncached']['peak_gb']:.2f}, cached {runs['cached']['peak_gb']:.2f}; "
          f"{bound['pictures']}-picture chat with the image cache bounded at {bound['bound_mb']} MiB: it held at most "
          f"{bound['largest_cache_mib']:.1f} MiB (peak memory {bound['peak_gb']:.2f} GiB)")
    return {"ttft_ratio": [ratio(c["ttft_s"], u["ttft_s"]) for u, c in zip(uncached, cached)],
            "tower_pictures_cached": [c["tower_pictures"] for c in cached],
            "tower_pictures_uncached": [u["tower_pictures"] for u in uncached],
            "same_replies": all([c["reply"] for c in one] == [u["reply"] for u in other] for one, other
                                in zip(runs["cached"]["chats"], runs["uncached"]["chats"])),
            "peak_gb": {"cached": round(runs["cached"]["peak_gb"], 3), "uncached": round(runs["uncached"]["peak_gb"], 3)},
            "bound_mb": bound["bound_mb"], "bound_largest_cache_mib": bound["largest_cache_mib"],
            "bound_held": bound["largest_cache_mib"] <= bound["bound_mb"]}


def main() -> None:
    args = parse_args()
    if not (args.model_dir / "config.json").exists():
        build_model(args.model_dir, args.vision_layers)
    bans = token_bans(args.model_dir)
    runs = run(args, bans)
    bound = bound_check(args, bans)
    summary = report(runs, bound, args)
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps({"runs": runs, "bound": bound, "summary": summary}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
