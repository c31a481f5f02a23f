"""Every image-text family through the host on a chosen device and dtype, token for token against Hugging Face.

    python tools/families_on_device.py --lm cuda:0/fp32                       # every family on CUDA in fp32
    python tools/families_on_device.py --lm cpu/fp32 --vision cuda:0/16       # the tower on the GPU, the LM on the CPU
    python tools/families_on_device.py --lm cuda:0/bf16 --vision cuda:0/16    # tower fp16, LM bf16
    python tools/families_on_device.py --lm cpu/fp32 --vision cpu/bf16 gemma3 llava   # only these families
    python tools/families_on_device.py --lm cuda:0/fp32 --static-cache       # the static cache, compiled on CUDA

`--lm DEVICE/DTYPE` is where and in what dtype the language model is loaded (the whole checkpoint, as
`from_pretrained(dtype=...)` then `.to(device)`: this host's loader has no fp32 on CUDA). `--vision
DEVICE/BITS` sets the card's `vision_device` and `vision_bits` (and `projector_device` / `projector_bits`
for the original LLaVA release); without it they stay unset (the LM's own).

For each family of `fixtures/vlm_families.py` (and `llava_original`, the original LLaVA-1.5 layout of
`fixtures/tiny_models.py`): one chat turn with a picture through the host's chat (`chat.generate_chat_reply`,
the multimodal extension picking its pipeline), 8 greedy tokens. The reference is Hugging Face's
`model.generate(**inputs)` on the same loaded model (its tower moved and cast as the extension moved it),
the inputs from the checkpoint's own processor (`fixtures/hf_reference.py`), pixel tensors on the tower's
device and dtype, the rest on the LM's, the image token suppressed as the host's placeholder ban does.
Where Hugging Face itself cannot run the mixed placement (SmolVLM casts no features back), the family is
reported `reference_unavailable` with its error, not failed. The original release has no Hugging Face
class: its image rows are compared with the same pipeline's rows with the tower unmoved (relative error
below 6%, a 16-bit tower's rounding), and its reply must be non-empty.

`--static-cache`: for the families `modules/static_decode.py` serves, a chat of three turns and the third
asked again (`STATIC_TURNS`), prefix cache on, through our dynamic path and then through our static-cache
path (which transformers compiles on CUDA), reply for reply; the dynamic path is the one the plain run
checks against Hugging Face. A family passes when every reply is the same.

Prints one line per family, then one JSON object: `{"ok": bool, "families": {name: {...}}}`. Exit 1 when
any family failed: our turn raised, or our tokens differ from an available reference (where they do, the
first differing step and Hugging Face's top-two score margin there are reported; a margin of exactly 0.0
is a tie either token may take, and passes). Mllama with
`vision_bits` other than its LM's dtype must be refused with a ValueError naming the cause (transformers
builds its cross-attention mask in the vision model's dtype), and counts as passing when it is.
"""
from __future__ import annotations

import argparse
import faulthandler
import io
import json
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch._dynamo
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modules import chat, extensions, logits_processor_loader, models, prefix_cache, shared, static_decode  # noqa: E402

NEW_TOKENS = 8
QUESTION = "What is in the picture?"
DTYPES = {"fp32": torch.float32, "32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "16": torch.float16}
ORIGINAL = "llava_original"


def placement(text: str) -> tuple[str, str]:
    device, _, dtype = text.partition("/")
    if not device or dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DEVICE/DTYPE, DTYPE one of {', '.join(DTYPES)}")
    return device, dtype


def build(name: str, root: Path) -> Path:
    from fixtures import tiny_models, vlm_families

    if name == ORIGINAL:  # the folder's name picks the llava-v1.5-7b pipeline
        return tiny_models.build_llava_original(root / "tiny-llava-v1.5-7b", root / "tiny-clip")
    return vlm_families.FAMILIES[name](root / name)


def card_settings(vision: tuple[str, str] | None) -> dict:
    if vision is None:
        return {}
    device, bits = vision
    bits = {"fp32": 32, "32": 32, "fp16": 16, "16": 16}.get(bits, bits)
    return {f"multimodal-{part}_{key}": value for part in ("vision", "projector")
            for key, value in (("device", device), ("bits", bits))}


def load(folder: Path, lm: tuple[str, str], settings: dict) -> None:
    """`server.py --model FOLDER --extensions multimodal`'s start-up, the LM at `lm` (device, dtype)."""
    from transformers import AutoModelForImageTextToText

    device, dtype = lm
    argv = ["--model", str(folder), "--extensions", "multimodal"] + (["--cpu"] if device == "cpu" else [])
    shared.args = shared.parse_args(argv)
    shared.settings.update(settings)
    shared.user_setting_keys.update(settings)
    config = models.read_config_dict(folder)
    kwargs = {"dtype": DTYPES[dtype]}
    shared.is_multimodal = models.is_image_text_config(config)
    if config.get("model_type") == "llava_llama":
        model = models.load_llava_llama(folder, config, kwargs)
    else:
        model = AutoModelForImageTextToText.from_pretrained(folder, **kwargs)
    shared.model, shared.tokenizer = model.to(device).eval(), models.load_tokenizer(folder)
    shared.model_name = folder.name
    extensions.reset()
    prefix_cache.clear()  # nothing of the previous model's turns
    for module in [m for m in sys.modules if m.startswith("extensions.")]:
        del sys.modules[module]  # the extension's params are module-level: a fresh import per model
    extensions.load_extensions()
    classes = logits_processor_loader.requested_classes(shared.args.logits_processors, [])
    shared.logits_processors = logits_processor_loader.build_runner(classes)


def our_reply(picture: bytes) -> str:
    # The dynamic cache, which the static-cache run checks that path against: on CUDA the host's default
    # would compile each family's decoding step here.
    state = chat.new_state(None, do_sample=False, max_new_tokens=NEW_TOKENS, seed=0, message_images=[picture],
                           prefix_cache=False, static_cache=False)
    latest = list(chat.generate_chat_reply(QUESTION, state, loading_message=False))[-1]
    return latest["internal"][-1][1]


def hf_reply(folder: Path, picture: bytes) -> tuple[str, list[str], list[float]]:
    """Hugging Face's greedy reply from the loaded model (see the module docstring), its text after each
    step, and at each step how far its chosen token's score led the runner-up (0.0: an exact tie)."""
    from extensions.multimodal.pipelines.hf_auto.image_features import vision_device_dtype
    from fixtures import hf_reference

    model = shared.model
    processor = hf_reference.load(folder)
    image = Image.open(io.BytesIO(picture)).convert("RGB")
    inputs = hf_reference.chat_inputs(processor, [{"role": "user", "content": [
        {"type": "image", "image": image}, {"type": "text", "text": QUESTION}]}])
    lm_device = model.get_input_embeddings().weight.device
    tower_device, tower_dtype = vision_device_dtype(model)
    placed = {key: value.to(tower_device, tower_dtype) if key.startswith("pixel") and value.is_floating_point()
              else value.to(lm_device) for key, value in inputs.items() if isinstance(value, torch.Tensor)}
    with torch.inference_mode():
        output = model.generate(**placed, max_new_tokens=NEW_TOKENS, do_sample=False,
                                suppress_tokens=[model.config.image_token_id], output_scores=True,
                                return_dict_in_generate=True)
    ids = output.sequences[0, placed["input_ids"].shape[1]:]
    prefixes = [processor.tokenizer.decode(ids[:k + 1], skip_special_tokens=True).lstrip(" ") for k in range(len(ids))]
    top = torch.stack([step[0].float().topk(2).values for step in output.scores])  # (steps, 2)
    return prefixes[-1] if prefixes else "", prefixes, (top[:, 0] - top[:, 1]).tolist()


def original_rows_close(picture: bytes) -> float:
    """The original pipeline's rows against the same pipeline's with the tower and projector unmoved:
    the largest difference relative to the largest row value."""
    from extensions.multimodal.core import served_model

    script = sys.modules["extensions.multimodal.script"]
    pipeline = served_model.embedder(script.params).pipeline
    unmoved = type(pipeline)(pipeline.spec, {})
    image = Image.open(io.BytesIO(picture)).convert("RGB")
    ours, reference = pipeline.embed_images([image]), unmoved.embed_images([image])
    lm_device, lm_dtype = shared.model.get_input_embeddings().weight.device, shared.model.get_input_embeddings().weight.dtype
    if (ours.device, ours.dtype) != (lm_device, lm_dtype):
        raise AssertionError(f"rows on {ours.device}/{ours.dtype}, not the LM's {lm_device}/{lm_dtype}")
    return float((ours.float() - reference.float()).abs().max() / reference.float().abs().max())


def pipeline_error() -> str:
    """Why the extension has no pipeline for the loaded model (its ValueError, raised again), or ''."""
    from extensions.multimodal.core import served_model

    try:
        served_model.embedder(sys.modules["extensions.multimodal.script"].params)
    except (RuntimeError, ValueError) as error:
        return str(error)
    return ""


def tower_placement() -> str:
    script = sys.modules["extensions.multimodal.script"]
    from extensions.multimodal.core import served_model

    pipeline = served_model.embedder(script.params).pipeline
    return f"{pipeline.vision_dtype}@{pipeline.vision_device}".replace("torch.", "")


def check(name: str, root: Path, lm: tuple[str, str], vision: tuple[str, str] | None) -> dict:
    from fixtures.vlm_families import png

    folder = build(name, root)
    load(folder, lm, card_settings(vision))
    picture = png(64, 48, 1)
    result: dict = {"lm": f"{lm[1]}@{lm[0]}"}
    started = time.perf_counter()
    try:
        result["ours"] = our_reply(picture)
        result["tower"] = tower_placement()
    except ValueError as error:  # the picture refused: the pipeline refused the card's settings at load time
        cause = pipeline_error()
        refused = name == "mllama" and vision is not None and "cross-attention mask" in cause
        result.update(ok=refused, refused=f"{error} Cause: {cause}")
        return result
    if name == ORIGINAL:
        result["relative_row_error"] = round(original_rows_close(picture), 5)
        result["ok"] = result["relative_row_error"] < 0.06 and bool(result["ours"])
    else:
        try:
            result["hf"], prefixes, margins = hf_reply(folder, picture)
        except (RuntimeError, ValueError) as error:  # Hugging Face's own code refuses the placement
            result.update(ok=True, reference_unavailable=f"{type(error).__name__}: {str(error)[:200]}")
            return result
        result["ok"] = result["ours"] == result["hf"]
        if not result["ok"]:  # where ours leaves Hugging Face's reply, and how close its own top two were there
            step = next((k for k, prefix in enumerate(prefixes) if not result["ours"].startswith(prefix)), None)
            result.update(first_differing_step=step, hf_top2_margin=None if step is None else margins[step])
            result["ok"] = result["hf_top2_margin"] == 0.0  # an exact tie, broken the other way: no defect
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


# The static-cache chat: a picture, a text follow-up, a new picture, then the third turn asked again (its
# cache cropped back into the second turn's), as tests/test_static_decode.py runs it on a CPU.
STATIC_TURNS = [("What is in the picture?", (64, 48, 1)), ("And the colours?", None), ("And this one?", (48, 64, 2))]


def static_chat(static: bool) -> tuple[list[str], float]:
    """The replies of STATIC_TURNS through the host's chat, prefix cache on, and the seconds it took."""
    from fixtures.vlm_families import png

    prefix_cache.clear()
    started, replies, history = time.perf_counter(), [], None
    asked = STATIC_TURNS + STATIC_TURNS[-1:]
    for index, (text, picture) in enumerate(asked):
        if index == len(STATIC_TURNS):  # asked again: the history before the third turn
            history = {key: turns[:-1] for key, turns in history.items()}
        state = chat.new_state(history, do_sample=False, max_new_tokens=NEW_TOKENS, seed=0, static_cache=static,
                               message_images=[png(*picture)] if picture else None)
        history = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
        replies.append(history["internal"][-1][1])
    return replies, round(time.perf_counter() - started, 2)


def check_static(name: str, root: Path, lm: tuple[str, str]) -> dict:
    """Our static-cache path (compiled by transformers on CUDA) against our dynamic path, turn for turn;
    the dynamic path is checked against Hugging Face's by `check`. Each family compiles from nothing, as in
    a server that loaded only it: TorchDynamo keys its compiled code on transformers' forward wrappers, which
    every family shares, so a family after another was a recompile of the same frame, with its shapes and
    config values marked dynamic (torch's automatic dynamic shapes), counting toward the frame's recompile
    limit, past which the step runs eagerly."""
    torch._dynamo.reset()
    load(build(name, root), lm, {})
    dynamic, dynamic_s = static_chat(False)
    static, static_s = static_chat(True)  # the first static turn waits for the compile
    differing = [turn + 1 for turn, (a, b) in enumerate(zip(dynamic, static)) if a != b]
    slots = static_decode.cache_length(chat.new_state(static_cache=True), 1)  # None: it kept the dynamic cache
    return {"lm": f"{lm[1]}@{lm[0]}", "ok": not differing and slots is not None, "static_slots": slots,
            "differing_turns": differing, "dynamic": dynamic,
            "static": static, "seconds_dynamic": dynamic_s, "seconds_static_with_compile": static_s}


def main() -> int:
    from fixtures import vlm_families

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", help=f"default: every family and {ORIGINAL}")
    parser.add_argument("--lm", type=placement, default=("cpu", "fp32"), help="DEVICE/DTYPE of the language model")
    parser.add_argument("--vision", type=placement, default=None, help="DEVICE/BITS: the card's vision_device/vision_bits")
    parser.add_argument("--static-cache", action="store_true",
                        help="the static-cache families: our static path against our dynamic one over a chat")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    # Stopped from outside (tools/gpu_check.sh's time budget), say where every thread was.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    names = args.families or [*vlm_families.FAMILIES, ORIGINAL]
    if args.static_cache:
        names = [name for name in names if name in static_decode.FAMILIES]
    torch.set_grad_enabled(False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                results[name] = check_static(name, Path(tmp), args.lm) if args.static_cache \
                    else check(name, Path(tmp), args.lm, args.vision)
            except Exception as error:  # noqa: BLE001 - one family's fault is that family's verdict
                traceback.print_exc()
                results[name] = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
            verdict = "PASS" if results[name]["ok"] else "FAIL"
            print(f"{verdict} {name}: {json.dumps(results[name], ensure_ascii=True)}", flush=True)
    summary = {"ok": all(r["ok"] for r in results.values()), "lm": "/".join(args.lm),
               "vision": "/".join(args.vision) if args.vision else None, "families": results}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, ensure_ascii=True))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
