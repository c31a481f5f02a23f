"""Five-turn image chat: Hugging Face `generate(pixel_values=...)` vs our host, side by side in one run.

Builds a random llava-hf model and runs a 5-turn chat with a new picture on turns 1 and 3, measuring
per turn the time to first token (TTFT), decode speed and the vision tower's calls:
  (a) Hugging Face: `model.generate(**processor(whole conversation, all images))`;
  (b) our host with the image-embedding cache, the text memo and prefix KV reuse off (small size only);
  (c) our host with them on;
  (o) our host in the other dtype (`--size real`): bf16 against fp32 (CPU) or fp16 (CUDA), same weights;
  limit: a bare forward of only the new images and new tokens on the same model.
Every column embeds every picture (as Hugging Face does), so greedy tokens must be identical.

Sizes (`--size`):
  small (default): a CLIP-B/16-shaped tower at 224 px, a ~110M-parameter Llama (the earlier benchmark);
  real: LLaVA-1.5-7B's interface: a CLIP ViT-L/14-336 tower with all 24 layers (576 rows per picture),
        the 1024 -> 4096 -> 4096 projector, a Llama of width 4096 (vocabulary 32064) with `--text-layers`
        layers (default 2, so it fits a small machine; each adds ~200M parameters).
The host's columns decode with the dynamic cache; `--static-cache` gives them the static one (the host's
default on CUDA, compiled there by transformers), compiled before the first turn as server.py does.
`--dtype` is the dtype of columns (a)-(c), as a user starts the server: bf16 is `--bf16`; without it the
host loads fp32 on a CPU and fp16 on CUDA (so fp32 is for the CPU, fp16 for CUDA).

Prints a table and writes it to `--json-out` (default bench/out/multiturn-<size>-<dtype>.json); the last
line printed is one JSON object: turn1_ttft_ratio_vs_hf, turn5_ttft_ratio_vs_hf, turn5_ttft_ratio_vs_limit,
history_image_vision_calls, tokens_identical, first_differences (per turn and column whose reply differs
from HF's: the first greedy step where it leaves HF's, and HF's top-two score margin there),
differences_are_exact_ties (every such margin is 0.0: random weights in 16 bits tie exactly, and a tie
broken the other way is no defect) (+ bf16_prefill_ratio_vs_fp32 (vs_fp16 on CUDA),
decode_tps_ratio_vs_hf, bf16_decode_tps_ratio_vs_fp32, peak_rss_gb, extension_rss_overhead for --size real).
When bf16 tokens differ, bench/chunked_prefill.py tells whether it is the prefix cache's chunked prefill.
`--profile` adds ttft_profiles: one more run of (c), each turn from its start to its first token under
torch's profiler (bench/step_profile.py): its wall time, the device's working time, the kernels (on a
CPU, operators) that took it and, on a GPU, the host's operators and runtime calls (syncs, allocations).

    python bench/multiturn.py                          # ~4 minutes on 2 CPU cores (5 interleaved repeats)
    python bench/multiturn.py --size real --dtype bf16 # 44 minutes on 2 CPU cores without AMX (2 repeats)
    python bench/multiturn.py --size real --dtype fp16 --device cuda --text-layers 32   # a GPU: fp16 vs bf16
    python bench/multiturn.py --size real --dtype bf16 --device cuda --text-layers 32
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modules import chat, extensions, models, prefix_cache, shared, static_warm_up, text_generation  # noqa: E402
from fixtures import host_helpers, tiny_models  # noqa: E402

QUESTIONS = ["Describe the image.", "What colour is the shape?", "And this one?", "Which picture came first?",
             "Summarise our chat about the pictures."]
IMAGE_TURNS = {0: "red", 2: "blue"}


@dataclass(frozen=True)
class Size:
    """A benchmark model's shape: the vision tower, the language model, the defaults that fit it."""
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    image_size: int
    patch_size: int
    text_hidden: int
    text_intermediate: int
    text_heads: int
    text_kv_heads: int
    vocab: int  # 0: the tokenizer's own
    vision_layers: int
    text_layers: int
    repeats: int
    max_new_tokens: int


SIZES = {
    "small": Size(768, 3072, 12, 224, 16, 768, 2048, 12, 4, 0, vision_layers=12, text_layers=17, repeats=5,
                  max_new_tokens=24),
    # The host-overhead proxy (bench/decode.py): a step costs little more than the Python around it, as a
    # GPU's compiled step does.
    "micro": Size(64, 128, 4, 224, 16, 64, 128, 4, 4, 0, vision_layers=1, text_layers=1, repeats=2,
                  max_new_tokens=16),
    "real": Size(1024, 4096, 16, 336, 14, 4096, 11008, 32, 32, 32064, vision_layers=24, text_layers=2, repeats=2,
                 max_new_tokens=16),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="small")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--text-layers", type=int, default=None)
    parser.add_argument("--vision-layers", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="runs per column; the table shows medians")
    parser.add_argument("--model-dir", type=str, default=None,
                        help="keep the model folder here (built when missing, reused when present)")
    parser.add_argument("--json-out", type=str, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="one more run of (c), each turn's TTFT under torch's profiler (bench/step_profile.py)")
    parser.add_argument("--static-cache", action="store_true",
                        help="the host's columns decode with the static cache (compiled on CUDA, where it is the "
                             "host's default), compiled before the first turn as server.py does; else the dynamic one")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="every column's attention with cuDNN's backend on CUDA, which the host otherwise turns "
                             "off (its --cudnn-attention, modules/attention_backend.py)")
    args = parser.parse_args()
    size = SIZES[args.size]
    for name in ("text_layers", "vision_layers", "max_new_tokens", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(size, name))
    if args.dtype != "bf16" and args.dtype != base_dtype(args):
        parser.error(f"--dtype {args.dtype} is not what the host loads on {args.device}: use bf16 or {base_dtype(args)}")
    args.json_out = args.json_out or str(ROOT / "bench" / "out" / f"multiturn-{args.size}-{args.dtype}.json")
    return args


# -- The model -----------------------------------------------------------------------------------------

def base_dtype(args) -> str:
    """What the host loads without --bf16: fp16 on CUDA, fp32 on a CPU (modules/models.py)."""
    return "fp16" if args.device.startswith("cuda") else "fp32"


def build_tokenizer(vocab: int):
    """The tests' BPE tokenizer, its vocabulary grown to `vocab` ids, so every id the model can generate
    decodes to text. The new ids are words of the BPE model's own vocabulary (" w123"), not added
    tokens: a real tokenizer has a handful of added tokens, and tens of thousands would slow every
    tokenizer call (Hugging Face's processor and ours alike)."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = tiny_models.build_tokenizer()
    if vocab <= len(tokenizer):
        return tokenizer
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    words = data["model"]["vocab"]
    start = len(tokenizer)
    words.update({f"\u0120w{i}": start + i for i in range(vocab - start)})  # "\u0120": byte-level space
    grown = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                    bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                                    unk_token=tokenizer.unk_token, pad_token=tokenizer.pad_token,
                                    additional_special_tokens=tiny_models.SPECIAL_TOKENS[4:])
    grown.chat_template = tokenizer.chat_template
    return grown


def build_model(path: Path, args) -> Path:
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)

    size = SIZES[args.size]
    tokenizer = build_tokenizer(size.vocab)
    rows = (size.image_size // size.patch_size) ** 2
    vision = CLIPVisionConfig(hidden_size=size.vision_hidden, intermediate_size=size.vision_intermediate,
                              num_hidden_layers=args.vision_layers, num_attention_heads=size.vision_heads,
                              image_size=size.image_size, patch_size=size.patch_size, projection_dim=768)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=size.text_hidden,
                       intermediate_size=size.text_intermediate, num_hidden_layers=args.text_layers,
                       num_attention_heads=size.text_heads, num_key_value_heads=size.text_kv_heads,
                       max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_seq_length=rows,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    # Made on the bench's device, in the dtype the host loads there without --bf16 (fp16 on CUDA): at
    # LLaVA-1.5-7B's shapes, fp32 on the CPU is 28 GB to initialise, write and read back, out of the
    # few minutes a lent GPU gives tools/gpu_check.sh.
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[base_dtype(args)]
    with torch.device(args.device):
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype).eval()
    model.save_pretrained(path)
    processor = LlavaProcessor(image_processor=tiny_models.image_processor(size.image_size), tokenizer=tokenizer,
                               patch_size=size.patch_size, vision_feature_select_strategy="default",
                               chat_template=tiny_models.CHAT_TEMPLATE, num_additional_image_tokens=1)
    processor.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    lm = sum(p.numel() for p in model.model.language_model.parameters()) / 1e6
    print(f"model: {params:.0f}M parameters ({lm:.0f}M language model, {rows} rows per picture), saved to {path}")
    return path


def picture(colour: str, size: int) -> Image.Image:
    image = Image.new("RGB", (size * 4 // 3, size), "white")
    ImageDraw.Draw(image).ellipse((size // 4, size // 6, size, size * 5 // 6), fill=colour)
    return image


def turn_images(args, turn: int) -> list[bytes]:
    """The pictures sent with `turn` (0-based): one on the turns of IMAGE_TURNS, none on the others."""
    return [png_bytes(picture(IMAGE_TURNS[turn], SIZES[args.size].image_size))] if turn in IMAGE_TURNS else []


def png_bytes(image: Image.Image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def rss_gb() -> float:
    """This process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


def load_host(model_dir: Path, args, dtype: str) -> dict:
    """The model as `server.py --model DIR [--bf16]` loads it; the memory the extension adds, measured."""
    from extensions.multimodal.pipelines.hf_auto.image_features import vision_parts

    argv = ["--model", str(model_dir), "--multimodal-pipeline", "llava-hf"] + (["--cpu"] if args.device == "cpu" else []) \
        + (["--cudnn-attention"] if args.cudnn_attention else [])
    shared.args = shared.parse_args(argv + (["--bf16"] if dtype == "bf16" else []))
    extensions.reset()  # a second load (the other dtype) starts from scratch: no model held twice
    for name in [m for m in sys.modules if m.startswith("extensions.multimodal")]:
        del sys.modules[name]
    prefix_cache.clear()
    shared.model = shared.tokenizer = None
    gc.collect()
    shared.model, shared.tokenizer = models.load_model(str(model_dir))
    shared.model_name = model_dir.name
    shared.settings["multimodal-add_all_images_to_prompt"] = True
    # The cache the host's columns decode with, said outright: on CUDA the host's default is the static one.
    shared.settings["static_cache"] = bool(getattr(args, "static_cache", False))
    bare = current_rss_gb()
    extensions.load_extensions()
    if shared.settings["static_cache"]:
        static_warm_up.compile_static_decode()  # as server.py does before serving: no turn waits for the compile
    tower_bytes = sum(p.numel() * p.element_size() for part in vision_parts(shared.model) for p in part.parameters())
    return {"rss_bare_gb": bare, "rss_with_extension_gb": current_rss_gb(), "tower_gb": tower_bytes / 2**30}


def current_rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30


def multimodal():
    return sys.modules["extensions.multimodal.script"]


def set_caches(on: bool) -> None:
    """Caches on/off: image embeddings, tokenized text parts, prefix KV reuse."""
    from extensions.multimodal.core import prompt_encoding, served_model
    from extensions.multimodal.core.bounded_lru import BoundedLRU
    from extensions.multimodal.core.embedding_cache import megabytes

    embedder = served_model.embedder(multimodal().params)
    embedder.images.cache = BoundedLRU(megabytes(2048) if on else 0)
    embedder.prompts.memo = BoundedLRU(prompt_encoding.MEMO_BYTES if on else 0)
    prefix_cache.clear()
    shared.settings["prefix_cache"] = on


class VisionCounter:
    """Counts images that go through the vision tower (forward hook on the tower)."""

    def __init__(self, model):
        self.images = 0
        self.handle = model.model.vision_tower.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        pixel_values = inputs[0] if inputs else None
        self.images += int(pixel_values.shape[0]) if pixel_values is not None else 0


# -- The columns ---------------------------------------------------------------------------------------

def host_turn(history: dict, text: str, images: list, args,
              at_first_token: Callable[[], None] | None = None) -> tuple[float, float, dict, str, int]:
    """(TTFT, decode tokens/s, history, reply, prompt tokens) for one turn through the host's chat.

    The chat yields once per generated token, then once more with the finished turn (output hooks):
    decode speed is from the first token's yield to the last token's, as the streamer times Hugging Face.
    `at_first_token` is called at the first token's yield (`profile_turns`).
    """
    state = dict(shared.settings)
    state.update(do_sample=False, max_new_tokens=args.max_new_tokens, ban_eos_token=True, seed=0, history=history,
                 message_images=images or None)
    started = time.perf_counter()
    times, latest = [], history
    for latest in chat.generate_chat_reply(text, state, loading_message=False):
        times.append(time.perf_counter() - started)
        if len(times) == 1 and at_first_token is not None:
            at_first_token()
    stats = state["generation_stats"]
    return (times[0], (stats["completion_tokens"] - 1) / max(times[-2] - times[0], 1e-9), latest,
            latest["internal"][-1][1], stats["prompt_tokens"])


def run_host(args, label: str, caches: bool, counter: VisionCounter) -> dict:
    set_caches(caches)
    history = chat.new_history()
    result = {"ttft": [], "tps": [], "replies": [], "vision_images": [], "reused": [], "prompt_tokens": []}
    for turn in range(len(QUESTIONS)):
        before = counter.images
        images = turn_images(args, turn)
        with host_helpers.reused_tokens() as reused:
            ttft, tps, history, reply, prompt_tokens = host_turn(history, QUESTIONS[turn], images, args)
        result["reused"].append(sum(reused))
        result["prompt_tokens"].append(prompt_tokens)
        for key, value in (("ttft", ttft), ("tps", tps), ("replies", reply), ("vision_images", counter.images - before)):
            result[key].append(value)
        print(f"  ({label}) turn {turn + 1}: ttft {ttft * 1000:8.1f} ms, {tps:6.1f} tokens/s, "
              f"vision images {counter.images - before}")
    result["history"] = history
    return result


def profile_turns(args) -> list[dict]:
    """One more run of (c), each turn from its start to its first token under torch's profiler
    (bench/step_profile.py, a window of one "step"): where each TTFT goes, device and host."""
    from bench import step_profile

    set_caches(True)
    history, found = chat.new_history(), []
    for turn in range(len(QUESTIONS)):
        images = turn_images(args, turn)
        window = step_profile.StepWindow(args.device, skip=0, steps=1)
        try:
            window.tick()
            history = host_turn(history, QUESTIONS[turn], images, args, at_first_token=window.tick)[2]
            found.append({"turn": turn + 1, **window.result()})
        except Exception as error:  # the profiler's failure costs its own figures only
            found.append({"turn": turn + 1, "error": f"{type(error).__name__}: {error}"[:300]})
            break
        print(f"  (profile) turn {turn + 1}: {json.dumps(found[-1])}")
    return found


def same_prompts(result: dict) -> None:
    """Stops the bench where the host answered a turn from another prompt than the whole conversation
    Hugging Face's `generate` is given: where the chat and the reply pass the context, the host leaves
    out the oldest turns (text-generation-webui's rule: the prompt gets truncation_length - max_new_tokens)."""
    for turn, ours in enumerate(result["prompt_tokens"]):
        prompt, images = hf_conversation(result["history"], turn)
        whole = int(hf_processor()(text=prompt, images=images or None, return_tensors="pt")["input_ids"].shape[1])
        if ours != whole:
            sys.exit(f"bench/multiturn.py: turn {turn + 1}'s prompt through the host was {ours} tokens, the whole "
                     f"conversation {whole}: with {shared.settings['truncation_length']} tokens of context "
                     f"(truncation_length) the host left out older turns, and the columns would answer different "
                     f"prompts. Ask for fewer --max-new-tokens.")


def hf_conversation(history: dict, upto: int) -> tuple[str, list]:
    """The prompt HF sees for turn `upto` (0-based): `<image>` where our history holds a tag."""
    from extensions.multimodal.core.image_codec import IMAGE_TAG_RE

    turns = [list(t) for t in history["internal"][:upto + 1]]
    turns[-1][1] = None
    images = []
    messages = []
    for user, bot in turns:
        images += [tag_to_image(m.group("data")) for m in IMAGE_TAG_RE.finditer(user)]
        messages.append({"role": "user", "content": IMAGE_TAG_RE.sub("<image>", user)})
        if bot is not None:
            messages.append({"role": "assistant", "content": bot})
    prompt = shared.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt, images


class TokenTimer:
    """A streamer that notes when the first and the last generated token arrive."""

    def __init__(self):
        self.first = self.last = None
        self.calls = 0

    def put(self, value):
        self.calls += 1  # the first call carries the prompt
        if self.calls >= 2:
            self.last = time.perf_counter()
            self.first = self.first or self.last

    def end(self):
        pass


def run_hf(args, history: dict) -> dict:
    result = {"ttft": [], "tps": [], "replies": [], "prefixes": [], "margins": []}
    for turn in range(len(QUESTIONS)):
        prompt, images = hf_conversation(history, turn)
        started = time.perf_counter()
        inputs = hf_processor()(text=prompt, images=images or None, return_tensors="pt").to(args.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(shared.model.dtype)
        timer = TokenTimer()
        with torch.inference_mode():
            out = shared.model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                                        suppress_tokens=[shared.tokenizer.eos_token_id,
                                                         shared.model.config.image_token_id],
                                        streamer=timer, pad_token_id=shared.tokenizer.pad_token_id,
                                        output_scores=True, return_dict_in_generate=True)
        reply_ids = out.sequences[0, inputs["input_ids"].shape[1]:]
        result["ttft"].append(timer.first - started)
        result["tps"].append((len(reply_ids) - 1) / max(timer.last - timer.first, 1e-9))
        reply = shared.tokenizer.decode(reply_ids, skip_special_tokens=True)
        result["replies"].append(reply.lstrip(" "))
        result["prefixes"].append(reply_prefixes(reply_ids))  # untimed, as are the margins
        result["margins"].append(top_two_margins(out.scores))
        print(f"  (a) turn {turn + 1}: ttft {result['ttft'][-1] * 1000:8.1f} ms, {result['tps'][-1]:6.1f} tokens/s")
    return result


def reply_prefixes(reply_ids: torch.Tensor) -> list[str]:
    """The reply's text after each greedy step (as the replies are compared: decoded, leading space dropped)."""
    return [shared.tokenizer.decode(reply_ids[:k + 1], skip_special_tokens=True).lstrip(" ")
            for k in range(len(reply_ids))]


def top_two_margins(scores: tuple) -> list[float]:
    """Per greedy step, how far HF's chosen token's score (after its suppressions) led the runner-up: 0.0 is
    an exact tie, which either side may break its own way without a defect."""
    top = torch.stack([step[0].float().topk(2).values for step in scores])  # (steps, 2)
    return (top[:, 0] - top[:, 1]).tolist()


def first_differences(main: dict) -> list[dict]:
    """Where a column's reply leaves HF's: per turn and column, the first greedy step whose text is no
    longer a prefix of that column's reply, and HF's top-two margin there."""
    hf, found = main["a"], []
    for column, runs in main.items():
        if column == "a" or "replies" not in runs:
            continue
        for turn, (ours, theirs) in enumerate(zip(runs["replies"], hf["replies"])):
            if ours == theirs:
                continue
            step = next((k for k, prefix in enumerate(hf["prefixes"][turn]) if not ours.startswith(prefix)), None)
            found.append({"turn": turn + 1, "column": column, "step": step,
                          "hf_top2_margin": None if step is None else hf["margins"][turn][step]})
    return found


def run_limit(args, history: dict, reused: list[int]) -> list[float]:
    """Per turn: vision forward of the turn's new images + a forward of only the tokens (c) did not reuse."""
    times = []
    set_caches(False)
    for turn in range(len(QUESTIONS)):
        previous_len = reused[turn]
        prompt = chat.generate_chat_prompt(history["internal"][turn][0], dict(shared.settings, history={
            "internal": history["internal"][:turn], "visible": history["visible"][:turn]}, max_new_tokens=args.max_new_tokens))
        state = dict(shared.settings, max_new_tokens=args.max_new_tokens)
        _, _, embeds = multimodal().tokenizer_modifier(state, prompt, None, None)
        new_images = [tag_to_image(m) for m in multimodal_tags(history["internal"][turn][0])]
        with torch.inference_mode():
            cache = None
            if previous_len:
                cache = shared.model(inputs_embeds=embeds[:, :previous_len], use_cache=True).past_key_values
            finish_queued_work(args)  # the cache's forward, queued on a GPU, is not this turn's time
            started = time.perf_counter()
            if new_images:
                pixels = hf_processor().image_processor(new_images, return_tensors="pt")["pixel_values"]
                shared.model.get_image_features(pixel_values=pixels.to(args.device, shared.model.dtype))
            shared.model(inputs_embeds=embeds[:, previous_len:], past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
            finish_queued_work(args)  # nothing reads the logits: without this a GPU's time is the launches'
            times.append(time.perf_counter() - started)
        print(f"  (limit) turn {turn + 1}: {times[-1] * 1000:8.1f} ms")
    return times


def finish_queued_work(args) -> None:
    """Waits for the kernels queued on a GPU (a CPU runs each operation before returning)."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def tag_to_image(b64: str) -> Image.Image:
    from extensions.multimodal.core.image_codec import tag_b64_to_image

    return tag_b64_to_image(b64)


def multimodal_tags(text: str) -> list[str]:
    from extensions.multimodal.core.image_codec import IMAGE_TAG_RE

    return [match.group("data") for match in IMAGE_TAG_RE.finditer(text)]


@functools.cache
def hf_processor():
    """Hugging Face's own processor for the served folder (columns (a) and the limit)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(shared.model.config._name_or_path)


def on_compute_thread(fn, *args):
    """Runs (a) and the limit on the thread where the host runs all model compute, so every column
    gets the same warm OpenMP team (a thread's first torch calls are slower on a small CPU)."""
    return text_generation.compute_thread().submit(fn, *args).result()


def median_run(results: list[dict]) -> dict:
    """The first run, with each turn's TTFT and tokens/s replaced by the median over the runs."""
    merged = dict(results[0])
    for key in ("ttft", "tps"):
        if key in merged:
            merged[key] = [statistics.median(r[key][t] for r in results) for t in range(len(results[0][key]))]
    return merged


# -- A run ---------------------------------------------------------------------------------------------

def measure(model_dir: Path, args, dtype: str, columns: tuple) -> tuple[dict, dict]:
    """Load the model in `dtype`, warm up, then `args.repeats` interleaved runs of `columns`; medians."""
    memory = load_host(model_dir, args, dtype)
    counter = VisionCounter(shared.model)
    print(f"[{dtype}] warm-up")
    same_prompts(run_host(args, f"{dtype} warm-up", True, counter))
    runs: dict[str, list] = {column: [] for column in columns}
    order = [column for column in columns if column != "limit"]  # (c) comes before (a): (a) replays its chat
    for repeat in range(args.repeats):  # interleaved, order flipped each time: noise hits every column alike
        print(f"-- [{dtype}] repeat {repeat + 1}/{args.repeats}")
        for column in (order if repeat % 2 == 0 else order[::-1]):
            if column == "a":
                runs["a"].append(on_compute_thread(run_hf, args, runs["c"][0]["history"]))
            else:
                runs[column].append(run_host(args, column, column != "b", counter))
        if "limit" in runs:
            runs["limit"].append({"ttft": on_compute_thread(run_limit, args, runs["c"][0]["history"],
                                                           runs["c"][-1]["reused"])})
    counter.handle.remove()
    memory["peak_rss_gb"] = rss_gb()
    return {column: median_run(results) for column, results in runs.items()}, memory


def report(args, main: dict, other: dict | None, memory: dict, profiles: list[dict] | None = None) -> dict:
    hf, on, limit = main["a"], main["c"], main["limit"]["ttft"]
    rows = []
    off = main.get("b")
    print(f"\n{'turn':>4} {'(a) HF ms':>10}" + (f" {'(b) off ms':>11}" if off else "") +
          f" {'(c) ours ms':>12} {'limit ms':>9} {'c/a':>6} {'c/limit':>8} {'HF tok/s':>9} {'ours tok/s':>11}" +
          (f" {'(o) other ms':>13} {'bf16/' + base_dtype(args):>10}" if other else ""))
    for t in range(len(QUESTIONS)):
        row = {"turn": t + 1, "hf_ttft_ms": hf["ttft"][t] * 1e3, "ours_ttft_ms": on["ttft"][t] * 1e3,
               "limit_ms": limit[t] * 1e3, "ours_vs_hf": on["ttft"][t] / hf["ttft"][t],
               "ours_vs_limit": on["ttft"][t] / limit[t], "hf_decode_tps": hf["tps"][t], "ours_decode_tps": on["tps"][t],
               "vision_images": on["vision_images"][t]}
        if off:
            row["off_ttft_ms"] = off["ttft"][t] * 1e3
        line = (f"{t + 1:>4} {row['hf_ttft_ms']:>10.1f}" + (f" {row['off_ttft_ms']:>11.1f}" if off else "") +
                f" {row['ours_ttft_ms']:>12.1f} {row['limit_ms']:>9.1f} "
                f"{row['ours_vs_hf']:>6.2f} {row['ours_vs_limit']:>8.2f} {row['hf_decode_tps']:>9.1f} "
                f"{row['ours_decode_tps']:>11.1f}")
        if other:
            bf16, base = (on, other["c"]) if args.dtype == "bf16" else (other["c"], on)
            row.update({"other_ttft_ms": other["c"]["ttft"][t] * 1e3, "other_decode_tps": other["c"]["tps"][t],
                        f"bf16_vs_{base_dtype(args)}": bf16["ttft"][t] / base["ttft"][t]})
            line += f" {row['other_ttft_ms']:>13.1f} {row[f'bf16_vs_{base_dtype(args)}']:>10.2f}"
        rows.append(row)
        print(line)
    replies = [main[k]["replies"] for k in main if "replies" in main[k]]
    identical = all(r == replies[0] for r in replies)
    differences = first_differences(main)
    if not identical:
        for t in range(len(QUESTIONS)):
            print(f"turn {t + 1}: " + " | ".join(f"{k}={main[k]['replies'][t]!r}" for k in main if "replies" in main[k]))
        for difference in differences:
            print(f"turn {difference['turn']}, column ({difference['column']}): leaves HF at step "
                  f"{difference['step']}, where HF's top-two margin is {difference['hf_top2_margin']}")
    summary = {
        "turn1_ttft_ratio_vs_hf": round(on["ttft"][0] / hf["ttft"][0], 3),
        "turn5_ttft_ratio_vs_hf": round(on["ttft"][4] / hf["ttft"][4], 3),
        "turn5_ttft_ratio_vs_limit": round(on["ttft"][4] / limit[4], 3),
        "history_image_vision_calls": sum(on["vision_images"]) - len(IMAGE_TURNS),
        "tokens_identical": identical,
        # Random weights make exact ties (margin 0.0) likely in 16 bits; a tie broken otherwise is no defect.
        "differences_are_exact_ties": all(d["hf_top2_margin"] == 0.0 for d in differences),
        "first_differences": differences,
    }
    if other:
        bf16, base = (on, other["c"]) if args.dtype == "bf16" else (other["c"], on)
        summary[f"bf16_prefill_ratio_vs_{base_dtype(args)}"] = round(bf16["ttft"][0] / base["ttft"][0], 3)
        summary["decode_tps_ratio_vs_hf"] = round(statistics.median(on["tps"]) / statistics.median(hf["tps"]), 3)
        summary[f"bf16_decode_tps_ratio_vs_{base_dtype(args)}"] = round(
            statistics.median(bf16["tps"]) / statistics.median(base["tps"]), 3)
        summary["peak_rss_gb"] = round(memory["peak_rss_gb"], 2)
        summary["extension_rss_overhead"] = round(memory["rss_with_extension_gb"] / memory["rss_bare_gb"] - 1, 4)
    if profiles is not None:
        summary["ttft_profiles"] = profiles
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps({"args": vars(args), "device": device_name(args), "turns": rows,
                                               "memory": memory, "summary": summary}, indent=2))
    print(f"table written to {args.json_out}")
    return summary


def device_name(args) -> str:
    if args.device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def cpu_name() -> str:
    """The CPU's model name and whether it has bf16 matrix instructions: without AMX or AVX512-BF16
    torch emulates bf16 matrix products, and bf16 prefill is slower than fp32, not faster."""
    import platform

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    bf16 = [flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags]
    return f"{name} ({', '.join(bf16) if bf16 else 'no AMX or AVX512-BF16'})"


def main() -> None:
    args = parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir or Path(tmp) / "bench-llava")
        if not (model_dir / "config.json").exists():
            build_model(model_dir, args)
        columns = ("c", "a", "limit") if args.size == "real" else ("b", "c", "a", "limit")
        main_runs, memory = measure(model_dir, args, args.dtype, columns)
        profiles = profile_turns(args) if args.profile else None
        other = None
        if args.size == "real":  # the same weights in the other dtype, our host only
            other_dtype = base_dtype(args) if args.dtype == "bf16" else "bf16"
            other, other_memory = measure(model_dir, args, other_dtype, ("c",))
            memory[f"{other_dtype}_tower_gb"] = other_memory["tower_gb"]
        print(json.dumps(report(args, main_runs, other, memory, profiles)))


if __name__ == "__main__":
    main()
