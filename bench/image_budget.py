"""Picture budgets on a five-turn screenshot chat: `default`, `low` and `high` side by side in one run.

Builds a Qwen2.5-VL checkpoint with random weights whose vision interface is Qwen2.5-VL-7B's (patch 14,
spatial merge 2, temporal patch 2, a 1280-wide tower with 16 heads and SwiGLU 3420, window 112 with a
full-attention block closing each group of eight, the 5120 -> 5120 -> LM-width merger) and the hub's
image processor settings (min_pixels 3136, max_pixels 12845056, CLIP mean and std), on a tiny language
model (width 256, 2 layers, the test tokenizer with Qwen's special tokens). The tower keeps
`--vision-layers` of its 32 blocks (default 4: three windowed and one full-attention, the last, so the
real run takes about eight minutes on 2 shared CPU cores; 8 would be the real tower's first eight
exactly); depth changes TTFT's size, not which budget gives how many tokens. The language model is tiny,
so TTFT here is the vision tower's; a 7B language model's prefill would add time that also grows with
the image tokens. The host loads it as `server.py --model DIR --extensions multimodal --cpu` does and
serves the OpenAI API in-process.

The chat: four synthetic 1920x1080 screenshots (an editor, a browser, a terminal, a spreadsheet; Pillow,
fixed seeds), one on each of turns 1-4, turn 5 text only. Each turn is a streaming, greedy
/v1/chat/completions request carrying the whole conversation so far (as OpenAI clients do) with
`image_budget` set to the column's budget; the prefix cache is on (the default). Per turn and column:
usage.prompt_tokens, usage.prompt_tokens_details.image_tokens, and the time to first token (TTFT: from
sending the request to the first SSE chunk, which the server sends once the first token exists).

Memory: each column runs in a fresh subprocess (ru_maxrss is process-wide and never goes down, so one
process would give every later column the earlier peaks). Two numbers per column: `peak_rss_gb`, that
process's ru_maxrss (model load included: the weights are the same in every column), and
`chat_peak_gb`, the highest resident size a 5 ms sampler saw during the measured chat minus the resident
size just before it (what the pictures and their prompts add). A warm-up turn with a small picture
runs first in each process, so TTFT excludes one-time start-up work.

Why `high` may equal `default` here: Qwen2.5-VL's hub processor already reads a picture at native
resolution up to 12845056 pixels, so a 1920x1080 screenshot is resized only to multiples of 28
(1932x1092: 69x39 merged patches = 2691 tokens). `high` caps at 2048x2048 pixels but never below the
default, so it keeps the default's 12845056 and lays the screenshot out the same way; `low` caps at
512x512 pixels. A checkpoint whose processor reads less by default (a smaller max_pixels) would show
`high` above `default`.

    python bench/image_budget.py --smoke      # 768x432 pictures, 1 vision block: about a minute
    python bench/image_budget.py              # the real run: 465 s on 2 shared AMD EPYC cores (4 vision blocks)

Prints one table (turns x columns) and, last, one JSON line of ratios against `default` for `low` and
`high`; writes everything to `--json-out` (default bench/results/image_budget.json; with --smoke
bench/out/image_budget-smoke.json).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = ("default", "low", "high")
QUESTIONS = ["What does this screenshot show?", "And this one: what changed?", "Where is the error in this one?",
             "Read the selected cell of this one.", "Summarise the four screenshots."]
IMAGE_TURNS = 4  # turns 1-4 carry one screenshot each; turn 5 is text only
REAL_VISION_DEPTH = 32
FULL_ATTENTION_BLOCKS = (7, 15, 23, 31)  # Qwen2.5-VL-7B's fullatt_block_indexes
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
LM = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          max_position_embeddings=32768)
MROPE_SECTION = [8, 12, 12]  # Qwen2.5-VL's [16, 24, 24] for head_dim 128, halved for head_dim 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="768x432 pictures and 1 vision block: a quick check")
    parser.add_argument("--vision-layers", type=int, default=None, help="vision blocks kept (default 4; smoke 1)")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1,
                        help="chats per column (new screenshots each time, so no cache serves them); medians")
    parser.add_argument("--model-dir", type=str, default=None, help="keep the model here (built when missing)")
    parser.add_argument("--json-out", type=str, default=None)
    parser.add_argument("--child", choices=COLUMNS, help=argparse.SUPPRESS)  # one column, in its own process
    parser.add_argument("--child-out", type=str, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vision_layers is None:
        args.vision_layers = 1 if args.smoke else 4
    args.picture_size = (768, 432) if args.smoke else (1920, 1080)  # smoke: above low's 512x512 pixels still
    # the real run's table is kept with the other benchmarks' results; a smoke run's is scratch (ignored by git)
    default_out = ROOT / "bench" / ("out/image_budget-smoke.json" if args.smoke else "results/image_budget.json")
    args.json_out = args.json_out or str(default_out)
    return args


# -- The model -----------------------------------------------------------------------------------------

def full_attention_blocks(depth: int) -> list[int]:
    """The real tower's full-attention blocks among the first `depth`; a shorter tower still ends on one,
    so every run pays for one attention over the whole picture."""
    return [i for i in FULL_ATTENTION_BLOCKS if i < depth] or [depth - 1]


def build_model(path: Path, vision_layers: int) -> Path:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    from fixtures import tiny_processors, vlm_families

    tokenizer = vlm_families.qwen_tokenizer(vlm_families.hub_template("qwen2_5_vl"))
    vision = dict(depth=vision_layers, hidden_size=1280, intermediate_size=3420, num_heads=16, hidden_act="silu",
                  out_hidden_size=LM["hidden_size"], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  window_size=112, fullatt_block_indexes=full_attention_blocks(vision_layers), in_channels=3,
                  tokens_per_second=2)
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": MROPE_SECTION}
    config = Qwen2_5_VLConfig(text_config=vlm_families.text_config(tokenizer, rope_parameters=rope, **LM),
                              vision_config=vision, **vlm_families.qwen_vision_ids(tokenizer))
    image_processor = Qwen2VLImageProcessorPil(  # the hub's preprocessor_config.json for Qwen2.5-VL-7B-Instruct
        patch_size=14, merge_size=2, temporal_patch_size=2, size={"shortest_edge": 3136, "longest_edge": 12845056},
        image_mean=CLIP_MEAN, image_std=CLIP_STD)
    processor = tiny_processors.build("Qwen2_5_VLProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      chat_template=vlm_families.hub_template("qwen2_5_vl"))
    vlm_families.save(path, Qwen2_5_VLForConditionalGeneration, config, processor, seed=0)
    print(f"model: Qwen2.5-VL vision interface, {vision_layers}/{REAL_VISION_DEPTH} vision blocks "
          f"(full attention at {vision['fullatt_block_indexes']}), LM width {LM['hidden_size']} x "
          f"{LM['num_hidden_layers']} layers; saved to {path}")
    return path


# -- The screenshots -----------------------------------------------------------------------------------

def words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                    for _ in range(count))


def screenshot(kind: int, size: tuple[int, int], seed: int) -> bytes:
    """A UI-like PNG: a title bar, then an editor (0), a browser (1), a terminal (2) or a spreadsheet (3)."""
    import io

    from PIL import Image, ImageDraw, ImageFont

    rng, (width, height) = random.Random(seed * 10 + kind), size
    dark = kind == 2
    image = Image.new("RGB", size, (30, 30, 30) if dark else (250, 250, 252))
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    ink = (200, 220, 200) if dark else (20, 20, 20)
    draw.rectangle((0, 0, width, 36), fill=(45, 50, 60))
    draw.text((12, 12), words(rng, 4), fill=(230, 230, 230), font=font)
    if kind == 0:  # editor: a file tree, line numbers, code
        draw.rectangle((0, 36, width // 7, height), fill=(235, 237, 240))
        for row, y in enumerate(range(50, height - 16, 16)):
            draw.text((10, y), words(rng, 1), fill=(60, 60, 60), font=font)
            draw.text((width // 7 + 8, y), f"{row + 1:4d}", fill=(150, 150, 150), font=font)
            draw.text((width // 7 + 60 + 16 * rng.randint(0, 4), y), words(rng, rng.randint(1, 8)), fill=ink, font=font)
    elif kind == 1:  # browser: an address bar, a heading, paragraphs, a picture box, buttons
        draw.rectangle((80, 44, width - 80, 70), outline=(180, 180, 190), fill=(255, 255, 255))
        draw.text((90, 52), "https://" + words(rng, 1) + ".example/" + words(rng, 1), fill=ink, font=font)
        draw.rectangle((width // 2 + 60, 120, width - 120, height // 2), fill=(120, 160, 200))
        for y in range(120, height - 120, 18):
            draw.text((120, y), words(rng, rng.randint(4, 12)), fill=ink, font=font)
        for x in range(120, 720, 150):
            draw.rounded_rectangle((x, height - 90, x + 130, height - 56), 8, fill=(40, 110, 220))
    elif kind == 2:  # terminal: prompt lines, output, one red error line
        for y in range(50, height - 16, 15):
            colour = (240, 90, 80) if rng.random() < 0.03 else ink
            draw.text((10, y), ("$ " if rng.random() < 0.2 else "") + words(rng, rng.randint(1, 14)), fill=colour,
                      font=font)
    else:  # spreadsheet: a grid of cells with numbers, one selected cell
        for x in range(0, width, 110):
            draw.line((x, 60, x, height), fill=(210, 210, 215))
        for y in range(60, height, 22):
            draw.line((0, y, width, y), fill=(210, 210, 215))
            for x in range(4, width - 100, 110):
                draw.text((x, y + 5), f"{rng.uniform(-999, 9999):.2f}", fill=ink, font=font)
        x, y = 110 * rng.randint(1, 12), 60 + 22 * rng.randint(1, 30)
        draw.rectangle((x, y, x + 110, y + 22), outline=(20, 120, 60), width=3)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# -- One column, in its own process ---------------------------------------------------------------------

def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30


class RssSampler:
    """The highest resident size seen while it runs (a thread reading /proc/self/statm every 5 ms)."""

    def __init__(self):
        self.peak, self.running = rss_gb(), True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss_gb())
            time.sleep(0.005)

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return max(self.peak, rss_gb())


def ask(client, messages: list, budget: str, args) -> dict:
    """One streaming turn: TTFT, the reply and usage."""
    from fixtures.api_helpers import wait_until_unlocked

    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="bench", messages=messages, stream=True, temperature=0, max_tokens=args.max_new_tokens,
        stream_options={"include_usage": True}, extra_body={"image_budget": budget, "ban_eos_token": True})
    ttft, reply, usage, dropped = None, "", None, []
    for chunk in stream:
        ttft = ttft if ttft is not None else time.perf_counter() - started
        reply += "".join(choice.delta.content or "" for choice in chunk.choices)
        dropped += (chunk.model_extra or {}).get("dropped_images", [])
        usage = chunk.usage or usage
    wait_until_unlocked()  # the server's generation has ended before the next request is timed
    details = usage.model_dump().get("prompt_tokens_details") or {}  # a declared field or an extra, by client version
    return {"ttft_s": ttft, "prompt_tokens": usage.prompt_tokens, "image_tokens": details.get("image_tokens") or 0,
            "completion_tokens": usage.completion_tokens, "dropped_images": dropped, "reply": reply}


def chat(client, budget: str, args, seed: int) -> list[dict]:
    """The five turns, each request carrying the conversation so far."""
    from fixtures.api_helpers import data_url

    messages, turns = [], []
    for turn, question in enumerate(QUESTIONS):
        content: list = [{"type": "text", "text": question}]
        if turn < IMAGE_TURNS:
            url = data_url(screenshot(turn, args.picture_size, seed))
            content.insert(0, {"type": "image_url", "image_url": {"url": url}})
        messages.append({"role": "user", "content": content})
        turns.append(ask(client, messages, budget, args))
        messages.append({"role": "assistant", "content": turns[-1]["reply"]})
    return turns


def run_column(args) -> dict:
    """Load the model into the host, serve the API, warm up, then `args.repeats` measured chats."""
    from fixtures import api_helpers, host_helpers

    started = time.perf_counter()
    host_helpers.load(Path(args.model_dir), ["multimodal"], argv=["--cpu"])
    api = api_helpers.start_api()
    client = api.client().with_options(timeout=1800)  # a real-size turn can take minutes on a small CPU
    load_s = time.perf_counter() - started
    warm_up = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": api_helpers.data_url(api_helpers.image_bytes(size=224))}},
        {"type": "text", "text": "Warm-up."}]}]
    ask(client, warm_up, args.child, args)
    runs, chat_peaks = [], []
    for repeat in range(args.repeats):
        before = rss_gb()
        sampler = RssSampler()
        runs.append(chat(client, args.child, args, seed=repeat))
        chat_peaks.append(sampler.stop() - before)
        print(f"  [{args.child}] chat {repeat + 1}/{args.repeats}: TTFT ms " +
              " ".join(f"{t['ttft_s'] * 1e3:.0f}" for t in runs[-1]), flush=True)
    api.stop()
    turns = runs[0]
    for t, turn in enumerate(turns):
        turn["ttft_s"] = statistics.median(run[t]["ttft_s"] for run in runs)
        turn["ttft_runs_s"] = [run[t]["ttft_s"] for run in runs]
    import torch

    return {"column": args.child, "turns": turns, "load_s": load_s, "threads": torch.get_num_threads(),
            "rss_before_chat_gb": before,
            "chat_peak_gb": max(chat_peaks), "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


# -- The run -------------------------------------------------------------------------------------------

def run_child(column: str, model_dir: Path, out: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--model-dir", str(model_dir),
               "--child", column, "--child-out", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    result = json.loads(out.read_text())
    print(f"[{column}] done in {time.perf_counter() - started:.0f} s (load {result['load_s']:.0f} s)", flush=True)
    return result


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def summary(columns: dict) -> dict:
    base = columns["default"]["turns"]
    out = {}
    for name in COLUMNS[1:]:
        turns, col = columns[name]["turns"], columns[name]
        ttft = [t["ttft_s"] for t in turns]
        out[name] = {
            "prompt_tokens_ratio": ratio(turns[-1]["prompt_tokens"], base[-1]["prompt_tokens"]),
            "prompt_tokens_ratio_by_turn": [ratio(t["prompt_tokens"], b["prompt_tokens"]) for t, b in zip(turns, base)],
            "image_tokens_ratio": ratio(turns[-1]["image_tokens"], base[-1]["image_tokens"]),
            "ttft_ratio_by_turn": [ratio(t, b["ttft_s"]) for t, b in zip(ttft, base)],
            "ttft_ratio_total": ratio(sum(ttft), sum(b["ttft_s"] for b in base)),
            "peak_memory_ratio": ratio(col["peak_rss_gb"], columns["default"]["peak_rss_gb"]),
            "chat_peak_memory_ratio": ratio(col["chat_peak_gb"], columns["default"]["chat_peak_gb"]),
        }
    return out


def print_table(columns: dict) -> None:
    """Turns x columns: prompt tokens, image tokens, TTFT, and TTFT over the default's; then memory."""
    names, width = list(columns), 9 * len(columns) - 1
    ttfts = {n: [t["ttft_s"] for t in columns[n]["turns"]] for n in names}
    print(f"\n{'':>5} | {'prompt tokens':^{width}} | {'image tokens':^{width}} | {'TTFT ms':^{width}} | "
          f"{'TTFT / default':^17}")
    head = " ".join(f"{n:>8}" for n in names)
    print(f"{'turn':>5} | {head} | {head} | {head} | {'low':>8} {'high':>8}")
    for t in range(len(QUESTIONS)):
        cells = [" ".join(f"{columns[n]['turns'][t][key]:>8}" for n in names)
                 for key in ("prompt_tokens", "image_tokens")]
        print(f"{t + 1:>5} | {cells[0]} | {cells[1]} | " + ttft_cells({n: v[t] for n, v in ttfts.items()}))
    print(f"{'total':>5} | {'':>{width}} | {'':>{width}} | " + ttft_cells({n: sum(v) for n, v in ttfts.items()}))
    for key, label in (("peak_rss_gb", "peak RSS of the column's process"), ("chat_peak_gb", "RSS the chat added")):
        print(f"{label:<33} GiB: " + ", ".join(f"{n} {columns[n][key]:.3f}" for n in names))
    dropped = {n: [t["dropped_images"] for t in columns[n]["turns"] if t["dropped_images"]] for n in names}
    print("dropped images: " + (json.dumps(dropped) if any(dropped.values()) else "none"))


def ttft_cells(ttft: dict) -> str:
    return (" ".join(f"{v * 1e3:>8.0f}" for v in ttft.values()) + " | " +
            " ".join(f"{ttft[n] / ttft['default']:>8.3f}" for n in COLUMNS[1:]))


def check_depth(model_dir: Path, vision_layers: int) -> None:
    depth = json.loads((model_dir / "config.json").read_text())["vision_config"]["depth"]
    if depth != vision_layers:
        raise ValueError(f"{model_dir} holds {depth} vision blocks, not --vision-layers {vision_layers}: pass "
                         f"--vision-layers {depth}, or another --model-dir to build one")


def cpu_name() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")


def main() -> None:
    args = parse_args()
    if args.child:  # one column, in this fresh process
        Path(args.child_out).write_text(json.dumps(run_column(args)))
        return
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir or Path(tmp) / "bench-qwen2_5_vl")
        if not (model_dir / "config.json").exists():
            build_model(model_dir, args.vision_layers)
        check_depth(model_dir, args.vision_layers)
        columns = {c: run_child(c, model_dir, Path(tmp) / f"{c}.json") for c in COLUMNS}
    print_table(columns)
    result = {"vision_layers": args.vision_layers, "picture_size": args.picture_size, "smoke": args.smoke,
              "cpu": cpu_name(), "threads": columns["default"]["threads"],
              "run_s": round(time.perf_counter() - started),
              "load_average_1min": [load_before, os.getloadavg()[0]],  # others' work on the cores: TTFT noise
              "ratios_vs_default": summary(columns)}
    print(f"{args.vision_layers}/{REAL_VISION_DEPTH} vision blocks, pictures {args.picture_size[0]}x"
          f"{args.picture_size[1]}, {result['cpu']}, {result['threads']} threads, run {result['run_s']} s, "
          f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps({**result, "args": vars(args), "columns": columns}, indent=2))
    print(f"written to {args.json_out}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
