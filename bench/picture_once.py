"""Turn 1 with a new picture: decodes, processor runs and time, side by side in one run: the product
(`kept`: the pixels decoded to store the picture kept for its first read, and the prepared picture
kept from its layout for its embedding), without the stored pixels (`upload's pixels not kept`: the
picture is decoded to be stored and again to be laid out) and without either (`not kept`).

Two checkpoints with random weights and real vision interfaces: llava-hf (LLaVA-1.5's CLIP-336
processor: shortest edge 336, centre crop 336, patch 14, 576 image tokens) and Qwen2-VL (the hub's
image processor: patch 14, merge 2, temporal patch 2, min_pixels 3136, max_pixels 12845056, CLIP mean
and std), each on a tiny language model and a one-block tower of width 32 with the real patch grid
(so the tower's time here is small, as on a GPU; the CPU work before it is real). Pictures: JPEGs of
1024x768 and 2048x1536 (smooth colour fields with noise, quality 90, fixed seeds), a new one for each
repeat so no cache serves it.

Turn 1, as this repository's host runs it: the upload (`history_images.history_tags`: the picture
checked and stored as its tag), the prompt measured twice (`len_in_tokens`, as the chat and its
truncation do), then embedded (`forward`). `upload's pixels not kept` bounds the codec's store of
stored pictures' pixels at 0 bytes; `not kept` also sets `embedding_cache_mb: 0`, which bounds the
store of laid-out pictures at 0 bytes: the picture is decoded and processed again when embedded. Counted by wrappers here: full decodes
(`image_codec.decode_opened`) and processor runs (`process_images`); timed: the whole turn and the time
inside those two (`cpu prep`).

Also text-generation-webui's processor route (`tgw/serving.route_inputs`): the prompt measured
(`custom_tokenized_length`) then given to the tokenizer hook. `kept` is the product (the last inputs
kept); `not kept` forgets them between the two calls, as before.

    python bench/picture_once.py --smoke   # 1024x768 only, 1 repeat
    python bench/picture_once.py           # both sizes, 3 repeats, medians

Prints a table and writes `--json-out` (default bench/results/picture_once.json).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from fixtures import host_helpers, tiny_models, tiny_processors, vlm_families  # noqa: E402

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
STATE = {"add_bos_token": True, "truncation_length": 32768, "max_new_tokens": 16}
# Column -> (embedding_cache_mb, whether the codec keeps a stored picture's pixels for its first read).
COLUMNS = {"kept": (256, True), "upload's pixels not kept": (256, False), "not kept": (0, False)}


def build_llava(path: Path, chat_template: str = tiny_models.CHAT_TEMPLATE) -> Path:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tokenizer = tiny_models.build_tokenizer()
    config = LlavaConfig(vision_config=CLIPVisionConfig(**TOWER, image_size=336, patch_size=14),
                         text_config=tiny_models.text_config(tokenizer),
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=576,
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    config.pad_token_id = tokenizer.pad_token_id
    image_processor = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                                         image_mean=CLIP_MEAN, image_std=CLIP_STD)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", chat_template=chat_template,
                               num_additional_image_tokens=1)
    return vlm_families.save(path, LlavaForConditionalGeneration, config, processor, seed=0)


def build_qwen2_vl(path: Path) -> Path:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    template = vlm_families.hub_template("qwen2_vl")
    tokenizer = vlm_families.qwen_tokenizer(template)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    config = Qwen2VLConfig(text_config=vlm_families.text_config(tokenizer, rope_parameters=rope),
                           vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                                              patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
                           **vlm_families.qwen_vision_ids(tokenizer))
    image_processor = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                                               size={"shortest_edge": 3136, "longest_edge": 12845056},
                                               image_mean=CLIP_MEAN, image_std=CLIP_STD)
    processor = tiny_processors.build("Qwen2VLProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      chat_template=template)
    return vlm_families.save(path, Qwen2VLForConditionalGeneration, config, processor, seed=0)


FAMILIES = {"llava-hf (CLIP 336)": (build_llava, "USER: {tag}\nWhat is in this photo?\nASSISTANT:"),
            "qwen2_vl (hub processor)": (build_qwen2_vl, "<|im_start|>user\n<|vision_start|>{tag}<|vision_end|>"
                                                         "What is in this photo?<|im_end|>\n<|im_start|>assistant\n")}


def photo_jpeg(size: tuple[int, int], seed: int) -> bytes:
    """A photo-like JPEG: smooth colour fields plus noise (a flat picture would compress to nothing)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(small).resize(size, Image.Resampling.BICUBIC), dtype=np.int16)
    noisy = np.clip(field + rng.normal(0, 12, field.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(noisy).save(out, format="JPEG", quality=90)
    return out.getvalue()


class Counter:
    """Wraps the product's decode and processor functions: calls and seconds inside them."""

    def __init__(self):
        from extensions.multimodal.core import image_codec
        from extensions.multimodal.pipelines.hf_auto import transformers_pipeline

        self.counts, self.seconds = {"decodes": 0, "processor runs": 0}, 0.0
        self.wrap(image_codec, "decode_opened", "decodes")
        self.wrap(transformers_pipeline, "process_images", "processor runs")

    def wrap(self, module, name: str, count: str) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.counts[count] += 1
                self.seconds += time.perf_counter() - started
        setattr(module, name, wrapper)

    def reset(self) -> None:
        self.counts = dict.fromkeys(self.counts, 0)
        self.seconds = 0.0


def embedder_turn(embedder, params: dict, template: str, jpeg: bytes):
    """Upload, two measures, embedding: what the host does in turn 1 with a new picture."""
    from extensions.multimodal.core import history_images

    tag = history_images.history_tags([jpeg], None, params)[0]
    prompt = template.format(tag=tag)
    embedder.len_in_tokens(prompt)
    embedder.len_in_tokens(prompt)
    with torch.inference_mode():
        return embedder.forward(prompt, dict(STATE))


def route_turn(script, template: str, jpeg: bytes, keep: bool) -> int:
    """text-generation-webui's processor route: the prompt measured, then its inputs for the tokenizer hook."""
    from extensions.multimodal.core import history_images

    serving = script.serving
    prompt = template.format(tag=history_images.history_tags([jpeg], None, script.params)[0])
    measured = int(serving.route_inputs(prompt, {}, script.params)["input_ids"].shape[-1])
    if not keep:
        serving._last_inputs = (None, None)  # as before: nothing kept between the two calls
    inputs = serving.route_inputs(prompt, dict(STATE), script.params)
    assert inputs["input_ids"].shape[-1] == measured
    return measured


def run_family(name: str, model_dir: Path, template: str, sizes: list, repeats: int) -> list[dict]:
    host_helpers.load(model_dir, ["multimodal"])
    from extensions.multimodal import script
    from extensions.multimodal.core.multimodal_embedder import MultimodalEmbedder

    counter = Counter()
    rows = []
    seed = 100
    for size in sizes:
        samples = {column: [] for column in COLUMNS}
        route = {column: [] for column in COLUMNS}
        embedder_turn(MultimodalEmbedder(dict(script.params)), script.params, template, photo_jpeg((64, 48), 1))
        for _ in range(repeats):
            for column, (cache_mb, stored_pixels) in COLUMNS.items():  # interleaved, a new picture each time
                seed += 1
                jpeg = photo_jpeg(size, seed)
                embedder = MultimodalEmbedder({**script.params, "embedding_cache_mb": cache_mb})
                counter.reset()
                with codec_store(stored_pixels):
                    started = time.perf_counter()
                    result = embedder_turn(embedder, script.params, template, jpeg)
                    samples[column].append((time.perf_counter() - started, counter.seconds, dict(counter.counts),
                                            result.image_tokens[0]))
                    with_route(script, route[column], counter, template, jpeg, cache_mb > 0)
        for column in COLUMNS:
            turn, prep, counts, tokens = (statistics.median(s[0] for s in samples[column]),
                                          statistics.median(s[1] for s in samples[column]),
                                          samples[column][-1][2], samples[column][-1][3])
            rows.append({"family": name, "picture": f"{size[0]}x{size[1]}", "column": column,
                         "image_tokens": tokens, **counts, "turn1_s": round(turn, 3), "cpu_prep_s": round(prep, 3),
                         "route_processor_runs": route[column][-1][1],
                         "route_s": round(statistics.median(r[0] for r in route[column]), 3)})
    return rows


@contextlib.contextmanager
def codec_store(on: bool):
    """The codec's store of stored pictures' pixels as the product has it, or bounded at 0 bytes."""
    from extensions.multimodal.core import image_codec

    product = image_codec._stored_pixels
    image_codec._stored_pixels = product if on else image_codec.BoundedLRU(0)
    try:
        yield
    finally:
        image_codec._stored_pixels = product


def with_route(script, samples: list, counter: Counter, template: str, jpeg: bytes, keep: bool) -> None:
    """The processor route for the same picture: its time and processor runs (counted at the pipeline)."""
    pipeline = script.served_model.embedder(script.params).pipeline
    calls = []
    original = type(pipeline).processor_inputs

    def counted(*args, **kwargs):
        calls.append(1)
        return original(pipeline, *args, **kwargs)
    pipeline.processor_inputs = counted
    started = time.perf_counter()
    route_turn(script, template, jpeg, keep)
    samples.append((time.perf_counter() - started, len(calls)))
    del pipeline.processor_inputs


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}{gpu}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="1024x768 only, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", type=str, default=str(ROOT / "bench" / "results" / "picture_once.json"))
    args = parser.parse_args()
    sizes = [(1024, 768)] if args.smoke else [(1024, 768), (2048, 1536)]
    repeats = 1 if args.smoke else args.repeats
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (build, template) in FAMILIES.items():
            model_dir = build(Path(tmp) / name.split()[0])
            saved = host_helpers.snapshot()
            try:
                rows += run_family(name, model_dir, template, sizes, repeats)
            finally:
                host_helpers.restore(saved)
    header = ["family", "picture", "column", "image_tokens", "decodes", "processor runs", "turn1_s", "cpu_prep_s",
              "route_processor_runs", "route_s"]
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[key]) for key in header))
    result = {"rows": rows, "repeats": repeats, "command": " ".join(["python", *sys.argv]), "machine": machine()}
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"json": args.json_out}))


if __name__ == "__main__":
    main()
