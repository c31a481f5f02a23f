"""Decode speed: our host's chat turn against Hugging Face's `generate` on the same picture chat.

A llava-hf model (bench/multiturn.py's builders) holds a chat of four turns with two pictures, each
reply `--new-tokens` long, written once by our host; then the fifth turn is answered `--runs` times
by each column, interleaved in pairs, the eager pair first (the order flips each run, so noise on a
shared machine hits both alike):
  ours:        the host's real chat path (`chat.generate_chat_reply`, prefix KV reuse on, the dynamic
               cache, as `static_cache: false` serves on CUDA and every reply on a CPU), tokens/s
               from the first streamed token to the last, as the UI and the API receive them;
  hf:          `model.generate(**processor(whole chat))` with a streamer that only notes the time;
  hf_static:   (`--compiled`) the same with `cache_implementation="static"`: on CUDA transformers
               compiles the decode step; on a CPU it does not (a static cache, eager);
  ours_static: (`--compiled`) our host with its static-cache setting (`--static-cache`);
  hf_static_our_slots: (`--equal-slots`, with `--compiled`) hf_static with a static cache of as many
               slots as ours (`static_decode.slots`, at least 4096) instead of the prompt's and the
               reply's: each step attends over every slot, so this tells the host's work per step
               from the cost of a longer cache (one more compile on CUDA).
Greedy decoding everywhere; EOS and the image placeholder are banned in every column.

Sizes: `--size small --text-layers 2` (default) is the overhead-bound proxy (width 768, 2 layers: a
CPU is bound by per-token overhead like a GPU only with a small model); `--size micro --text-layers 1`
(width 64) leaves little but the host's Python per token, the proxy for a GPU's compiled step, with
`--cpu-compile` (transformers compiles the static columns on a CPU too: its CompileConfig's
`_compile_all_devices`, mode "default", as CUDA graphs need a GPU); `--size real --text-layers 32`
is LLaVA-1.5-7B's shapes. Identity is tie-aware: where a column's reply differs from HF eager's, the
first differing step and HF's own top-two logit margin there are reported; a margin of exactly 0 is a
tie (either token is right), not a defect. With `--compiled`, one more (untimed) run of each of our
columns records every step's token and top-two margin: where the static path leaves the dynamic
one, both margins are reported (`ours_static.vs_ours`). On CUDA the JSON also gives each column's fraction of the
memory-bandwidth limit: tokens/s x bytes of weights read per token (the language model without its
input embeddings) / bandwidth (`--bandwidth` TB/s, else a table by GPU name), and the same with the
KV cache each step reads (`cache_slots_read`: a static cache is read whole, so its slots count).
`--profile`: after the timed runs, one more run of each column with up to 32 of its decoding steps under
torch's profiler (bench/step_profile.py): per step the wall time, the device's working time and their
ratio (on a GPU, the share it waited for the host), the kernels (on a CPU, operators) that took most
of it and, on CUDA, the runtime's launches and syncs (`step_profile` in each column's JSON).

    python bench/decode.py --runs 5                                        # the CPU proxy
    python bench/decode.py --size micro --new-tokens 256 --compiled --cpu-compile --runs 5   # host overhead
    python bench/decode.py --size micro --new-tokens 512 --compiled --cpu-compile --equal-slots --runs 5
    python bench/decode.py --device cuda --dtype bf16 --size real --text-layers 32 --compiled --json
    python bench/decode.py --size micro --new-tokens 64 --runs 1 --profile   # where a step goes
    python bench/decode.py --device cuda --dtype bf16 --size real --text-layers 32 --attention-backends --json
`--attention-backends` first writes the chat's history three times, each turn's TTFT and decode rate
recorded: with cuDNN's attention at lengths it meets for the first time, again at lengths it has planned,
and without it (modules/attention_backend.py says why the host turns it off on CUDA). On a CPU the three
run the same kernels.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import CompileConfig, LogitsProcessorList, StaticCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import multiturn, step_profile  # noqa: E402
from modules import chat, logits_processor_loader, prefix_cache, shared, static_decode  # noqa: E402
from modules.logits_bridge import LogitsProcessorRunner  # noqa: E402
from modules.logits_processors import LogitsProcessor  # noqa: E402

# Memory bandwidth by GPU name (TB/s), matched in order: "H100 PCIe" before "H100".
BANDWIDTH_TBPS = [("H100 PCIe", 2.0), ("H100", 3.35), ("H200", 4.8)]
TEXT_LAYERS = {"micro": 1, "small": 2, "real": 32}  # by --size, unless --text-layers says
HISTORY_TURNS = 4  # the turns written before the measured one (pictures on turns 1 and 3)
PROFILED_STEPS = 32  # --profile: the decoding steps each column's profile holds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None,
                        help="default: fp32 on a CPU, bf16 on CUDA")
    parser.add_argument("--size", choices=list(multiturn.SIZES), default="small")
    parser.add_argument("--text-layers", type=int, default=None, help="default: 1 (micro), 2 (small), 32 (real)")
    parser.add_argument("--vision-layers", type=int, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--compiled", action="store_true",
                        help="also HF generate(cache_implementation='static') and our host's --static-cache")
    parser.add_argument("--cpu-compile", action="store_true",
                        help="with --compiled on a CPU: transformers compiles the static columns' decode step")
    parser.add_argument("--equal-slots", action="store_true",
                        help="with --compiled: also HF's compiled static path with a cache as long as ours")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed runs, where each column's decode step goes (bench/step_profile.py)")
    parser.add_argument("--attention-backends", action="store_true",
                        help="first, the chat's history written three times: with cuDNN's attention at lengths it "
                             "meets for the first time, again with its plans kept, and without it")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="the host keeps cuDNN's attention backend (its --cudnn-attention) for the columns")
    parser.add_argument("--bandwidth", type=float, default=None, help="the GPU's memory bandwidth in TB/s")
    parser.add_argument("--model-dir", type=str, default=None, help="keep the model folder here (reused when present)")
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    args = parser.parse_args(argv)
    size = multiturn.SIZES[args.size]
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.text_layers = args.text_layers or TEXT_LAYERS[args.size]
    args.vision_layers = args.vision_layers or size.vision_layers
    args.max_new_tokens = args.new_tokens  # the name bench/multiturn.py's helpers read
    if args.dtype not in ("bf16", multiturn.base_dtype(args)):
        parser.error(f"--dtype {args.dtype} is not what the host loads on {args.device}: "
                     f"use bf16 or {multiturn.base_dtype(args)}")
    return args


def log(args, message: str) -> None:
    """Progress, on stderr with `--json` (stdout holds only the object): a run stopped by a time limit
    (tools/gpu_check.sh's) still leaves each measured run's figures in its log."""
    print(message, flush=True, file=sys.stderr if args.json else sys.stdout)


# -- The chat ----------------------------------------------------------------------------------------

def write_history(args, turns: list[dict] | None = None) -> dict:
    """The four turns before the measured one, answered by our host (pictures on turns 1 and 3); each
    turn's `host_turn` figures appended to `turns` when given."""
    history = chat.new_history()
    for turn in range(HISTORY_TURNS):
        result = host_turn(args, history, multiturn.QUESTIONS[turn], multiturn.turn_images(args, turn) or None)
        history = result.pop("history")
        if turns is not None:
            turns.append(result)
    return history


def whole_chat_tokens(args, history: dict) -> int:
    """The fifth turn's prompt as Hugging Face's `generate` gets it (the whole chat), in tokens."""
    return int(hf_inputs(args, history)["input_ids"].shape[1])


def hold_whole_chat(args, whole_chat: int) -> None:
    """Raises the host's context (truncation_length) to hold the whole chat and the measured reply, where
    the model's does not: Hugging Face's `generate` takes the whole chat, while the host leaves out the
    oldest turns to fit (`same_prompt`). Random weights write replies that tokenize longer when the chat
    is laid out again (128 tokens become several hundred at LLaVA-1.5-7B's shapes: 4123 tokens before the
    fifth turn), so the default chat passes that model's 4096."""
    needed = whole_chat + args.new_tokens
    context = int(shared.settings["truncation_length"])
    if needed > context:
        shared.settings["truncation_length"] = -(-needed // static_decode.BLOCK) * static_decode.BLOCK
        log(args, f"context raised from {context} to {shared.settings['truncation_length']} tokens: the chat "
                  f"and the reply need {needed}")


def turn_state(args, history: dict, images: list | None = None, **settings) -> dict:
    """A greedy turn's state; the dynamic cache unless `settings` say `static_cache` (the host's default on
    CUDA is the static one, which is the `ours_static` column)."""
    settings = {"max_new_tokens": args.new_tokens, "static_cache": False, **settings}
    return chat.new_state(history, do_sample=False, ban_eos_token=True, seed=0, message_images=images, **settings)


def attention_backends(args) -> dict:
    """`--attention-backends`, before anything else in the process has met the chat's lengths: the history
    written three times, each turn's TTFT and decode rate. (1) with cuDNN's attention, which builds a plan
    for each shape it meets (each turn's prefill, each decoding step's cache length); (2) with cuDNN again,
    the same turns, its plans kept (`same_replies`: the replies, and so the lengths, were the first
    writing's); (3) without cuDNN (the host's default on CUDA). Pictures go through the tower in (1) only
    (the embedding cache keeps them), so the TTFTs of turns 2 and 4 compare best. Without CUDA the three
    run the same kernels."""
    out, replies, before = {}, None, torch.backends.cuda.cudnn_sdp_enabled()
    for name, cudnn in (("cudnn_new_lengths", True), ("cudnn_seen_lengths", True), ("without_cudnn", False)):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        prefix_cache.clear()
        turns: list[dict] = []
        write_history(args, turns)
        out[name] = {"tokens_per_s": [round(t["tps"], 1) for t in turns],
                     "ttft_ms": [round(t["ttft"] * 1e3, 1) for t in turns]}
        if name == "cudnn_seen_lengths":
            out[name]["same_replies"] = [t["reply"] for t in turns] == replies
        log(args, f"attention {name}: {json.dumps(out[name])}")
        replies = [t["reply"] for t in turns]
    torch.backends.cuda.enable_cudnn_sdp(before)  # the host's choice again
    return out


# -- The columns -------------------------------------------------------------------------------------

def run_ours(args, history: dict, processor: LogitsProcessor | None = None, **settings) -> dict:
    """One measured turn through the host's chat, its prompt's KV cache kept from a one-token turn just
    before (the prefix cache's case: a regenerate; `ttft`), whose own TTFT is that of the whole prompt
    prefilled (`ttft_whole`: pictures from the embedding cache). The columns share one prefix cache,
    so each run makes its own. `processor`: one more batch-level logits processor, after the loaded
    ones, for the measured turn (untimed runs: `recorded_steps`, `step_profiles`)."""
    prefix_cache.clear()
    whole = host_turn(args, history, max_new_tokens=1, **settings)
    loaded = shared.logits_processors
    if processor is not None:
        shared.logits_processors = LogitsProcessorRunner((loaded.processors if loaded else []) + [processor])
    try:
        result = host_turn(args, history, **settings)
    finally:
        shared.logits_processors = loaded
    result.pop("history")
    return {**result, "ttft_whole": whole["ttft"]}


def host_turn(args, history: dict, question: str = multiturn.QUESTIONS[HISTORY_TURNS], images: list | None = None,
              **settings) -> dict:
    """TTFT, decode tokens/s, the reply and the history after it of one turn (by default the fifth)
    through the host's chat."""
    state = turn_state(args, history, images, **settings)
    started = time.perf_counter()
    samples = []  # (seconds since start, tokens generated so far) at each yield
    latest = history
    for latest in chat.generate_chat_reply(question, state, loading_message=False):
        samples.append((time.perf_counter() - started, state["generation_stats"]["completion_tokens"]))
    tokens = samples[-1][1]
    first = next(s for s in samples if s[1] >= 1)
    last = next(s for s in samples if s[1] == tokens)  # the yield that carried the last token
    prompt_tokens = state["generation_stats"]["prompt_tokens"]
    if tokens == 1:
        return {"ttft": first[0], "prompt_tokens": prompt_tokens, "history": latest}
    return {"ttft": first[0], "tps": (last[1] - first[1]) / max(last[0] - first[0], 1e-9), "tokens": tokens,
            "prompt_tokens": prompt_tokens, "reply": latest["internal"][-1][1], "history": latest}


def hf_inputs(args, history: dict):
    asked = {key: turns + [[multiturn.QUESTIONS[HISTORY_TURNS], ""]] for key, turns in history.items()}
    prompt, images = multiturn.hf_conversation(asked, HISTORY_TURNS)
    inputs = multiturn.hf_processor()(text=prompt, images=images or None, return_tensors="pt").to(args.device)
    inputs["pixel_values"] = inputs["pixel_values"].to(shared.model.dtype)
    return inputs


def hf_generate(args, inputs, **kwargs):
    return shared.model.generate(**inputs, max_new_tokens=args.new_tokens, do_sample=False,
                                 suppress_tokens=[shared.tokenizer.eos_token_id, shared.model.config.image_token_id],
                                 pad_token_id=shared.tokenizer.pad_token_id, **kwargs)


def run_hf(args, history: dict, **kwargs) -> dict:
    """One measured turn through Hugging Face's generate on the whole chat (processor time included in TTFT)."""
    started = time.perf_counter()
    inputs = hf_inputs(args, history)
    timer = multiturn.TokenTimer()
    with torch.inference_mode():
        out = hf_generate(args, inputs, streamer=timer, **kwargs)
    new = out[0, inputs["input_ids"].shape[1]:]
    return {"ttft": timer.first - started, "tps": (len(new) - 1) / max(timer.last - timer.first, 1e-9),
            "tokens": len(new), "prompt_tokens": int(inputs["input_ids"].shape[1]),
            "reply": shared.tokenizer.decode(new, skip_special_tokens=True).lstrip(" ")}


def hf_reference(args, history: dict) -> tuple[list[int], list[torch.Tensor]]:
    """HF eager's greedy ids and each step's processed scores (untimed), for tie-aware identity."""
    inputs = hf_inputs(args, history)
    with torch.inference_mode():
        out = hf_generate(args, inputs, output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), [s[0].float().cpu() for s in out.scores]


def identity(reply: str, reference_ids: list[int], scores: list[torch.Tensor]) -> dict:
    """Whether `reply` is HF eager's reply; else the first step whose token's text leaves `reply`, and
    HF's top-two margin there (0.0: an exact tie, either token is greedy's). A step whose text ends in
    an unfinished character (U+FFFD: a byte-level token that the next ones complete) is judged with them."""
    full = shared.tokenizer.decode(reference_ids, skip_special_tokens=True).lstrip(" ")
    if reply == full:
        return {"identical": True, "first_differing_step": None}
    for step in range(len(reference_ids)):
        text = shared.tokenizer.decode(reference_ids[:step + 1], skip_special_tokens=True).lstrip(" ")
        if not text.endswith("\ufffd") and not reply.startswith(text):
            top2 = scores[step].topk(2).values
            margin = float(top2[0] - top2[1])
            return {"identical": False, "first_differing_step": step, "hf_top2_margin": margin, "tie": margin == 0.0}
    return {"identical": False, "first_differing_step": len(reference_ids)}


def columns(args, whole_chat: int) -> dict:
    """Column name -> a function of the history (and of keyword arguments for `run_ours`'s settings or
    `run_hf`'s `generate`) giving one measured run."""
    def hf(history: dict, **kwargs) -> dict:
        return multiturn.on_compute_thread(lambda: run_hf(args, history, **kwargs))

    cols = {"ours": lambda h, **extra: run_ours(args, h, **extra),
            "hf": lambda h, **extra: hf(h, **extra)}
    if args.compiled:
        cols["hf_static"] = lambda h, **extra: hf(h, cache_implementation="static", **extra)
        cols["ours_static"] = lambda h, **extra: run_ours(args, h, static_cache=True, **extra)
    if args.compiled and args.equal_slots:
        cols["hf_static_our_slots"] = lambda h, **extra: hf(
            h, past_key_values=cache_of_our_length(args, whole_chat), **extra)
    return cols


def cache_of_our_length(args, whole_chat: int) -> StaticCache:
    """An empty static cache of the slots our host gives this turn (made outside the timed span)."""
    return StaticCache(config=shared.model.config, max_cache_len=our_slots(whole_chat, args.new_tokens))


def our_slots(prompt_tokens: int, new_tokens: int) -> int:
    return static_decode.slots(int(shared.settings["truncation_length"]), prompt_tokens + new_tokens)


def measure(args, history: dict, whole_chat: int) -> dict:
    """Each group of columns warmed up, then run interleaved: the eager pair first, so that a run stopped
    while the static group compiles has the eager figures already."""
    cols = columns(args, whole_chat)
    runs: dict[str, list[dict]] = {name: [] for name in cols}
    for group in (["ours", "hf"], ["hf_static", "ours_static", "hf_static_our_slots"]):
        group = [name for name in group if name in cols]
        for name in group:  # warm-up: allocator, OpenMP team, and the compile of the static path
            started = time.perf_counter()
            same_prompt(args, cols[name](history), whole_chat)
            log(args, f"warm-up {name}: {time.perf_counter() - started:.1f} s")
        for index in range(args.runs):
            for name in (group if index % 2 == 0 else group[::-1]):
                result = cols[name](history)
                runs[name].append(result)
                whole = f" (whole prompt {result['ttft_whole'] * 1e3:.1f} ms)" if "ttft_whole" in result else ""
                log(args, f"run {index + 1} {name:>11}: ttft {result['ttft'] * 1e3:8.1f} ms{whole}, "
                          f"{result['tps']:7.1f} tokens/s")
    return runs


def same_prompt(args, result: dict, whole_chat: int) -> None:
    """Stops the bench where a column answered another prompt than the whole chat Hugging Face's
    `generate` is given: where the chat and the reply pass the context, our host leaves out the oldest
    turns (text-generation-webui's rule: the prompt gets truncation_length - max_new_tokens)."""
    if result["prompt_tokens"] != whole_chat:
        sys.exit(f"bench/decode.py: the host's prompt was {result['prompt_tokens']} tokens, the whole chat "
                 f"{whole_chat} (truncation_length {shared.settings['truncation_length']}, {args.new_tokens} new "
                 f"tokens): the columns would answer different prompts")


class StepRecorder(LogitsProcessor):
    """For an untimed run: each step's greedy token and the top-two margin of the logits it was chosen
    from. The last processor (transformers runs its own EOS ban first), so every ban has been applied.
    It reads the logits back at every step (a sync on a GPU): never in a timed run."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float]] = []

    def is_argmax_invariant(self) -> bool:
        return False  # else the host skips it for greedy requests

    def update_state(self, batch_update) -> None:
        """Nothing to follow: one request."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        top = logits[0].float().topk(2)
        self.steps.append((int(top.indices[0]), float(top.values[0] - top.values[1])))
        return logits


def recorded_steps(args, history: dict, **settings) -> list[tuple[int, float]]:
    """The fifth turn as `run_ours` answers it, with a `StepRecorder` after the loaded processors:
    (token, top-two margin) per step of the measured turn."""
    recorder = StepRecorder()
    run_ours(args, history, processor=recorder, **settings)
    return recorder.steps


def static_vs_dynamic(dynamic: list[tuple[int, float]], static: list[tuple[int, float]]) -> dict:
    """Our static path's tokens against our dynamic path's: the first step where they part, and both
    paths' top-two margins there (an exact 0.0 on either side is a tie: either token is greedy's)."""
    for step, ((ours, margin), (theirs, static_margin)) in enumerate(zip(dynamic, static)):
        if ours != theirs:
            return {"identical": False, "first_differing_step": step, "dynamic_top2_margin": margin,
                    "static_top2_margin": static_margin, "tie": margin == 0.0 or static_margin == 0.0}
    same = len(dynamic) == len(static)
    return {"identical": same, "first_differing_step": None if same else min(len(dynamic), len(static))}


# -- Where a step goes (--profile) -------------------------------------------------------------------

class Tick(LogitsProcessor):
    """Ticks a `step_profile.StepWindow` at every decoding step: a processor of the host's runner
    (`apply`) or of Hugging Face's `generate` (called with the ids and the scores). Changes nothing."""

    def __init__(self, window: step_profile.StepWindow) -> None:
        self.window = window

    def is_argmax_invariant(self) -> bool:
        return False  # else the host skips it for greedy requests

    def update_state(self, batch_update) -> None:
        """Nothing to follow: one request."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.window.tick()
        return logits

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.window.tick()
        return scores


def step_profiles(args, history: dict, whole_chat: int) -> dict:
    """Each column's decode step under torch's profiler (bench/step_profile.py): one more run each, with
    a window of PROFILED_STEPS steps (at most the reply's less its first eighth and one) from inside the
    loop."""
    skip = max(1, args.new_tokens // 8)
    steps = min(PROFILED_STEPS, args.new_tokens - skip - 1)
    found = {}
    for name, run in columns(args, whole_chat).items():
        window = step_profile.StepWindow(args.device, skip, steps)
        try:
            if name.startswith("ours"):
                run(history, processor=Tick(window))
            else:
                run(history, logits_processor=LogitsProcessorList([Tick(window)]))
            found[name] = window.result()
        except Exception as error:  # the profiler's failure costs its own figures only, not the timed ones
            found[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
        log(args, f"profile {name:>11}: {json.dumps(found[name])}")
    return found


# -- The report --------------------------------------------------------------------------------------

def weight_bytes_per_token() -> int:
    """Bytes of weights one decode step reads: the language model and its head, not the input embedding
    table (one row of it) nor the vision tower (not run while decoding)."""
    language = shared.model.model.language_model
    embed = language.get_input_embeddings().weight
    head = shared.model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in language.parameters()) - embed.numel() * embed.element_size()
    return total + (head.numel() * head.element_size() if head.data_ptr() != embed.data_ptr() else 0)


def kv_bytes_per_slot() -> int:
    """Bytes of keys and values one cached token holds across the language model's layers."""
    text = shared.model.config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * shared.model.dtype.itemsize


def slots_read(column: str, prompt_tokens: int, new_tokens: int) -> float:
    """Cache slots one decode step attends over, on average over the reply: a dynamic cache holds the
    tokens so far; a static one is read whole, HF's sized to the prompt and the reply, ours by the host."""
    if column == "hf_static":
        return prompt_tokens + new_tokens
    if column in ("ours_static", "hf_static_our_slots"):
        return our_slots(prompt_tokens, new_tokens)
    return prompt_tokens + new_tokens / 2


def bandwidth_tbps(args, name: str) -> float | None:
    if args.bandwidth is not None:
        return args.bandwidth
    return next((tbps for key, tbps in BANDWIDTH_TBPS if key in name), None)


def report(args, runs: dict, reference: tuple[list[int], list[torch.Tensor]],
           steps: tuple[list, list] | None = None, profiles: dict | None = None) -> dict:
    name = multiturn.device_name(args)
    out: dict = {"device": name, "dtype": args.dtype, "size": args.size, "text_layers": args.text_layers,
                 "new_tokens": args.new_tokens, "runs": args.runs,
                 "prompt_tokens": runs["hf"][0]["prompt_tokens"]}
    bandwidth = bandwidth_tbps(args, name) if args.device == "cuda" else None
    per_token = weight_bytes_per_token()
    for column, results in runs.items():
        tps = [r["tps"] for r in results]
        entry = {"tokens_per_s": [round(t, 1) for t in tps], "median_tokens_per_s": round(statistics.median(tps), 1),
                 "ttft_ms": [round(r["ttft"] * 1e3, 1) for r in results],
                 "median_ttft_ms": round(statistics.median(r["ttft"] for r in results) * 1e3, 1),
                 "identity_vs_hf": identity(results[0]["reply"], *reference)}
        if "ttft_whole" in results[0]:
            entry["median_ttft_whole_prompt_ms"] = round(statistics.median(r["ttft_whole"] for r in results) * 1e3, 1)
        entry["cache_slots_read"] = slots_read(column, out["prompt_tokens"], args.new_tokens)
        if profiles and column in profiles:
            entry["step_profile"] = profiles[column]
        if bandwidth:
            entry["bandwidth_fraction"] = round(entry["median_tokens_per_s"] * per_token / (bandwidth * 1e12), 3)
            with_cache = per_token + entry["cache_slots_read"] * kv_bytes_per_slot()
            entry["bandwidth_fraction_with_cache"] = round(entry["median_tokens_per_s"] * with_cache / (bandwidth * 1e12), 3)
        out[column] = entry
    if steps is not None:  # static against dynamic, the same prefill chunks: only the cache differs
        out["ours_static"]["identical_to_ours"] = runs["ours_static"][0]["reply"] == runs["ours"][0]["reply"]
        out["ours_static"]["vs_ours"] = static_vs_dynamic(*steps)
    out["ratio_ours_vs_hf"] = round(out["ours"]["median_tokens_per_s"] / out["hf"]["median_tokens_per_s"], 3)
    if "ours_static" in out:
        out["ratio_ours_static_vs_hf"] = round(out["ours_static"]["median_tokens_per_s"] /
                                               out["hf"]["median_tokens_per_s"], 3)
        out["ratio_ours_static_vs_hf_static"] = round(out["ours_static"]["median_tokens_per_s"] /
                                                      out["hf_static"]["median_tokens_per_s"], 3)
    if "hf_static_our_slots" in out:
        out["ratio_ours_static_vs_hf_static_our_slots"] = round(out["ours_static"]["median_tokens_per_s"] /
                                                                out["hf_static_our_slots"]["median_tokens_per_s"], 3)
    if bandwidth:
        out["bandwidth_tbps"] = bandwidth
        out["weight_gb_per_token"] = round(per_token / 1e9, 2)
        out["kv_mb_per_slot"] = round(kv_bytes_per_slot() / 1e6, 3)
    return out


def static_compile_config(args) -> None:
    """Each static column compiled as it compiles alone: `dynamic=False`. transformers' default (None)
    leaves torch's automatic dynamic shapes on, so the second cache length to reach the one compiled
    forward (ours at 4096 slots after HF's at the prompt's and the reply's) would get a dynamic-shape
    graph, which a server decoding alone does not run. With `--cpu-compile` transformers compiles on any
    device (its testing flag), without CUDA graphs (mode "default"): the host's Python per step is then
    what a GPU's compiled step leaves of it."""
    config = CompileConfig(dynamic=False, **({"mode": "default"} if args.cpu_compile else {}))
    if args.cpu_compile:
        config._compile_all_devices = True
    shared.model.generation_config.compile_config = config


def main() -> None:
    args = parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir or Path(tmp) / "bench-llava")
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):  # --json: one object on stdout
            if not (model_dir / "config.json").exists():
                multiturn.build_model(model_dir, args)
            multiturn.load_host(model_dir, args, args.dtype)
            # As server.py does: the extension's batch-level logits processors (the placeholder ban); no
            # entry points, so that a plugin installed in this venv for the tests stays out.
            shared.logits_processors = logits_processor_loader.build_runner(
                logits_processor_loader.requested_classes(use_entry_points=False))
            if args.compiled:
                static_compile_config(args)
        backends = attention_backends(args) if args.attention_backends else None
        history = write_history(args)
        whole_chat = whole_chat_tokens(args, history)
        hold_whole_chat(args, whole_chat)
        runs = measure(args, history, whole_chat)
        steps = (recorded_steps(args, history), recorded_steps(args, history, static_cache=True)) \
            if args.compiled else None
        profiles = step_profiles(args, history, whole_chat) if args.profile else None
        result = report(args, runs, multiturn.on_compute_thread(hf_reference, args, history), steps, profiles)
        result["cudnn_attention"] = bool(torch.backends.cuda.cudnn_sdp_enabled())
        if backends is not None:
            result["attention_backends"] = backends
    if not args.json:
        for column in runs:
            entry = result[column]
            whole = f" (whole prompt {entry['median_ttft_whole_prompt_ms']:.1f} ms)" if "median_ttft_whole_prompt_ms" in entry else ""
            print(f"{column:>11}: median {entry['median_tokens_per_s']:7.1f} tokens/s, TTFT {entry['median_ttft_ms']:8.1f} ms"
                  f"{whole}, identical to HF: {entry['identity_vs_hf']}")
        print(f"ours / HF: {result['ratio_ours_vs_hf']}  (prompt {result['prompt_tokens']} tokens)")
        if "ours_static" in result:
            print(f"ours static against ours: {result['ours_static']['vs_ours']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
