"""When ours and Hugging Face's tokens differ in bf16, is it the prefix cache's chunked prefill?

The host's prefix cache computes a prompt in chunks (turn 1's prompt, then each turn's new part),
Hugging Face's `generate` computes the whole prompt at once. In fp32 both give the same tokens; in
bf16 a matrix product over 100 rows and one over 1600 rows may round the same row differently, and
on a random model a near tie between two next tokens then flips. This script runs the benchmark's
5-turn chat through the host (prefix cache on), then Hugging Face's `generate` on turn 5 twice:
on the whole prompt, and after prefilling its own KV cache in the same chunks the host used.
If the second equals ours, the difference is bf16 rounding of the chunking, not the host.

    python bench/multiturn.py --size real --dtype bf16 --model-dir /tmp/bench-real   # keeps the model
    python bench/chunked_prefill.py --model-dir /tmp/bench-real                        # ~8 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multiturn  # noqa: E402
from modules import shared  # noqa: E402


def hf_reply(history: dict, turn: int, args, chunks: list[int] | None) -> str:
    """Hugging Face's greedy reply to `turn` (0-based); with `chunks`, the prompt is prefilled in
    pieces ending at those positions before `generate` continues from the cache."""
    from transformers import DynamicCache

    prompt, images = multiturn.hf_conversation(history, turn)
    inputs = multiturn.hf_processor()(text=prompt, images=images or None, return_tensors="pt").to(args.device)
    pixels = inputs["pixel_values"].to(shared.model.dtype)
    ids = inputs["input_ids"]
    options = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=shared.tokenizer.pad_token_id,
                   suppress_tokens=[shared.tokenizer.eos_token_id, shared.model.config.image_token_id])
    if not chunks:
        out = shared.model.generate(**(dict(inputs) | {"pixel_values": pixels}), **options)
    else:
        cache = DynamicCache(config=shared.model.config.text_config)
        image_id, rows = shared.model.config.image_token_id, shared.model.config.image_seq_length
        start = first_image = 0
        for end in chunks:
            part = ids[:, start:end]
            count = int((part == image_id).sum()) // rows
            shared.model(input_ids=part, pixel_values=pixels[first_image:first_image + count] if count else None,
                         past_key_values=cache, use_cache=True, cache_position=torch.arange(start, end))
            first_image, start = first_image + count, end
        out = shared.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                    **options)
    return shared.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).lstrip(" ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True,
                        help="a benchmark model folder (bench/multiturn.py --model-dir; built when missing)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--size", choices=list(multiturn.SIZES), default="real")
    cli = parser.parse_args()
    sys.argv = [sys.argv[0], "--size", cli.size, "--dtype", cli.dtype, "--model-dir", cli.model_dir]
    args = multiturn.parse_args()
    torch.set_grad_enabled(False)
    if not (Path(args.model_dir) / "config.json").exists():
        multiturn.build_model(Path(args.model_dir), args)
    multiturn.load_host(Path(args.model_dir), args, args.dtype)
    ours = multiturn.run_host(args, "c", True, multiturn.VisionCounter(shared.model))
    last = len(multiturn.QUESTIONS) - 1
    chunks = [reused for reused in ours["reused"][1:last + 1] if reused]
    print(f"the host's prefill chunks end at {chunks}")
    whole = multiturn.on_compute_thread(hf_reply, ours["history"], last, args, None)
    chunked = multiturn.on_compute_thread(hf_reply, ours["history"], last, args, chunks)
    print(f"ours                        {ours['replies'][last]!r}\nHF, whole prompt            {whole!r}\n"
          f"HF, the host's chunks       {chunked!r}")
    print(f"ours == HF whole: {ours['replies'][last] == whole}; ours == HF in the same chunks: "
          f"{ours['replies'][last] == chunked}")


if __name__ == "__main__":
    main()
