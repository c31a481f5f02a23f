"""Five-turn image chat: Hugging Face `generate(pixel_values=...)` vs our host, caches off and on.

Builds a mid-size random llava-hf model (CLIP-B/16-shaped tower at 224 px, a ~110M-parameter Llama),
then runs a 5-turn chat with a new image on turns 1 and 3 and measures the time to first token per turn:
  (a) Hugging Face: `model.generate(**processor(whole conversation, all images))`;
  (b) our host with the image-embedding cache, the text memo and prefix KV reuse off;
  (c) our host with them on;
  limit: a bare forward of only the new images and new tokens on the same model.
All three embed every image in the conversation (add_all_images_to_prompt) so their greedy tokens must
be identical. Prints a table and ends with one JSON line. `--device cuda` and larger sizes for GPUs.

    python bench/multiturn.py            # ~4 minutes on 2 CPU cores (5 interleaved repeats, medians)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modules import chat, extensions, models, prefix_cache, shared, text_generation  # noqa: E402
from tests import tiny_models  # noqa: E402

QUESTIONS = ["Describe the image.", "What colour is the shape?", "And this one?", "Which picture came first?",
             "Summarise our chat about the pictures."]
IMAGE_TURNS = {0: "red", 2: "blue"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--text-hidden", type=int, default=768)
    parser.add_argument("--text-layers", type=int, default=17)
    parser.add_argument("--vision-layers", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--model-dir", type=str, default=None, help="reuse a model folder built earlier")
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration; the table shows medians")
    return parser.parse_args()


def build_model(path: Path, args) -> Path:
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)

    tokenizer = tiny_models.build_tokenizer()
    vision = CLIPVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=args.vision_layers,
                              num_attention_heads=12, image_size=224, patch_size=16, projection_dim=512)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.text_hidden, intermediate_size=args.text_hidden * 8 // 3,
                       num_hidden_layers=args.text_layers, num_attention_heads=12, num_key_value_heads=4,
                       max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_seq_length=196,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    processor = LlavaProcessor(image_processor=tiny_models.image_processor(224), tokenizer=tokenizer, patch_size=16,
                               vision_feature_select_strategy="default", chat_template=tiny_models.CHAT_TEMPLATE,
                               num_additional_image_tokens=1)
    processor.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    lm = sum(p.numel() for p in model.model.language_model.parameters()) / 1e6
    print(f"model: {params:.0f}M parameters ({lm:.0f}M language model), saved to {path}")
    return path


def picture(colour: str) -> Image.Image:
    image = Image.new("RGB", (320, 240), "white")
    ImageDraw.Draw(image).ellipse((80, 40, 240, 200), fill=colour)
    return image


def load_host(model_dir: Path, device: str) -> None:
    argv = ["--model", str(model_dir), "--multimodal-pipeline", "llava-hf"] + (["--cpu"] if device == "cpu" else [])
    shared.args = shared.parse_args(argv)
    shared.model, shared.tokenizer = models.load_model(str(model_dir))
    shared.model_name = model_dir.name
    shared.settings["multimodal-add_all_images_to_prompt"] = True
    extensions.load_extensions()


def multimodal():
    return sys.modules["extensions.multimodal.script"]


def set_caches(on: bool) -> None:
    """Caches on/off: image embeddings, tokenized text parts, prefix KV reuse."""
    from extensions.multimodal import multimodal_embedder
    from extensions.multimodal.embedding_cache import BoundedLRU, megabytes

    embedder = multimodal().embedder()
    embedder.cache = BoundedLRU(megabytes(256) if on else 0)
    embedder.text_memo = BoundedLRU(multimodal_embedder.TEXT_MEMO_BYTES if on else 0)
    prefix_cache.clear()
    shared.settings["prefix_cache"] = on


class VisionCounter:
    """Counts images that go through the vision tower (forward hook on the tower)."""

    def __init__(self, model):
        self.images = 0
        model.model.vision_tower.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        pixel_values = inputs[0] if inputs else None
        self.images += int(pixel_values.shape[0]) if pixel_values is not None else 0


def host_turn(history: dict, text: str, args) -> tuple[float, dict, str]:
    state = dict(shared.settings)
    state.update(do_sample=False, max_new_tokens=args.max_new_tokens, ban_eos_token=True, seed=0, history=history)
    started = time.perf_counter()
    ttft = None
    latest = history
    for latest in chat.generate_chat_reply(text, state, loading_message=False):
        if ttft is None:  # the first yield carries the first generated token
            ttft = time.perf_counter() - started
    return ttft, latest, latest["internal"][-1][1]


def user_message(turn: int, history_images: list) -> str:
    if turn in IMAGE_TURNS:
        tag = multimodal().image_bytes_to_tag(jpeg_bytes(picture(IMAGE_TURNS[turn])))
        history_images.append(tag)
        return f"{tag}{QUESTIONS[turn]}"
    return QUESTIONS[turn]


def jpeg_bytes(image: Image.Image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def run_host(args, label: str, caches: bool, counter: VisionCounter) -> dict:
    set_caches(caches)
    history = chat.new_history()
    tags: list = []
    result = {"ttft": [], "replies": [], "vision_images": [], "reused": []}
    for turn in range(len(QUESTIONS)):
        before = counter.images
        reused_before = prefix_cache.stats["reused_tokens"]
        ttft, history, reply = host_turn(history, user_message(turn, tags), args)
        result["reused"].append(prefix_cache.stats["reused_tokens"] - reused_before)
        result["ttft"].append(ttft)
        result["replies"].append(reply)
        result["vision_images"].append(counter.images - before)
        print(f"  ({label}) turn {turn + 1}: ttft {ttft * 1000:8.1f} ms, vision images {counter.images - before}")
    result["history"] = history
    return result


def hf_conversation(history: dict, upto: int) -> tuple[str, list]:
    """The prompt HF sees for turn `upto` (0-based): `<image>` where our history holds a tag."""
    from extensions.multimodal.image_codec import IMAGE_TAG_RE

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


class FirstTokenTimer:
    def __init__(self):
        self.first = None
        self.calls = 0

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self):
        pass


def run_hf(args, history: dict) -> dict:
    result = {"ttft": [], "replies": []}
    for turn in range(len(QUESTIONS)):
        prompt, images = hf_conversation(history, turn)
        started = time.perf_counter()
        inputs = shared.processor(text=prompt, images=images or None, return_tensors="pt").to(args.device)
        timer = FirstTokenTimer()
        with torch.inference_mode():
            out = shared.model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                                        suppress_tokens=[shared.tokenizer.eos_token_id], streamer=timer,
                                        pad_token_id=shared.tokenizer.pad_token_id)
        result["ttft"].append(timer.first - started)
        reply = shared.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        result["replies"].append(reply.lstrip(" "))
        print(f"  (a) turn {turn + 1}: ttft {result['ttft'][-1] * 1000:8.1f} ms")
    return result


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
            started = time.perf_counter()
            if new_images:
                pixels = shared.processor.image_processor(new_images, return_tensors="pt")["pixel_values"]
                shared.model.get_image_features(pixel_values=pixels.to(args.device))
            shared.model(inputs_embeds=embeds[:, previous_len:], past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
            times.append(time.perf_counter() - started)
        print(f"  (limit) turn {turn + 1}: {times[-1] * 1000:8.1f} ms")
    return times


def tag_to_image(b64: str) -> Image.Image:
    from extensions.multimodal.image_codec import tag_b64_to_image

    return tag_b64_to_image(b64)


def multimodal_tags(text: str) -> list[str]:
    from extensions.multimodal.image_codec import tag_payloads

    return tag_payloads(text)


def main() -> None:
    args = parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else build_model(Path(tmp) / "bench-llava", args)
        load_host(model_dir, args.device)
        counter = VisionCounter(shared.model)
        print("warm-up")
        run_host(args, "warm-up", True, counter)
        runs: dict[str, list] = {"a": [], "b": [], "c": [], "limit": []}
        for repeat in range(args.repeats):  # interleaved, order flipped each time: noise hits every column alike
            print(f"-- repeat {repeat + 1}/{args.repeats}")
            for column in (("b", "c", "a") if repeat % 2 == 0 else ("a", "c", "b")):
                runs[column].append(run_column(column, args, counter, runs))
            limit = on_compute_thread(run_limit, args, runs["c"][0]["history"], runs["c"][-1]["reused"])
            runs["limit"].append({"ttft": limit})
    report(*(median_run(runs[k]) for k in ("a", "b", "c")), median_run(runs["limit"])["ttft"],
           all_replies=[r["replies"] for k in ("a", "b", "c") for r in runs[k]])


def run_column(column: str, args, counter: VisionCounter, runs: dict) -> dict:
    if column == "a":  # Hugging Face replays the conversation (c) had, so all columns see the same text
        return on_compute_thread(run_hf, args, runs["c"][0]["history"])
    return run_host(args, column, column == "c", counter)


def on_compute_thread(fn, *args):
    """Runs (a) and the limit on the thread where the host runs all model compute, so every column
    gets the same warm OpenMP team (a thread's first torch calls are slower on a small CPU)."""
    return text_generation.compute_thread().submit(fn, *args).result()


def median_run(results: list[dict]) -> dict:
    """The first run, with each turn's TTFT replaced by the median over the runs."""
    merged = dict(results[0])
    merged["ttft"] = [statistics.median(r["ttft"][t] for r in results) for t in range(len(results[0]["ttft"]))]
    return merged


def report(hf: dict, off: dict, on: dict, limit: list[float], all_replies: list[list[str]]) -> None:
    print(f"\n{'turn':>4} {'(a) HF ms':>10} {'(b) off ms':>11} {'(c) on ms':>10} {'limit ms':>9} {'c/a':>6} {'c/limit':>8}")
    for t in range(len(QUESTIONS)):
        print(f"{t + 1:>4} {hf['ttft'][t] * 1e3:>10.1f} {off['ttft'][t] * 1e3:>11.1f} {on['ttft'][t] * 1e3:>10.1f} "
              f"{limit[t] * 1e3:>9.1f} {on['ttft'][t] / hf['ttft'][t]:>6.2f} {on['ttft'][t] / limit[t]:>8.2f}")
    identical = all(replies == all_replies[0] for replies in all_replies)
    if not identical:
        for t in range(len(QUESTIONS)):
            print(f"turn {t + 1}: a={hf['replies'][t]!r}\n        b={off['replies'][t]!r}\n        c={on['replies'][t]!r}")
    history_calls = sum(on["vision_images"]) - len(IMAGE_TURNS)
    print(json.dumps({
        "turn1_ttft_ratio_vs_hf": round(on["ttft"][0] / hf["ttft"][0], 3),
        "turn5_ttft_ratio_vs_hf": round(on["ttft"][4] / hf["ttft"][4], 3),
        "turn5_ttft_ratio_vs_limit": round(on["ttft"][4] / limit[4], 3),
        "history_image_vision_calls": history_calls,
        "tokens_identical": identical,
    }))


if __name__ == "__main__":
    main()
