"""Train the shipped demo model `models/tiny-llava-shapes/` from scratch on CPU.

    python -m tools.demo_model.train                  # the shipped weights: about 2 hours on 2 cores
    python -m tools.demo_model.train --vision-steps 3 --picture-steps 1 --spread-steps 2 --steps 3 \
        --polish-steps 3 --out /tmp/quick

Run from the repository root. In: nothing but fixed seeds (the same seeds and thread count give the
same bytes). Out: a Hugging Face folder (`LlavaForConditionalGeneration` with a CLIP vision tower,
a 2-layer GELU projector and a small Llama; a `LlavaProcessor` with the Pillow `CLIPImageProcessor`,
a byte-level BPE tokenizer and a chat template), loadable with `AutoModelForImageTextToText` /
`AutoProcessor`. The parts are built in `architecture`; pictures and chats come from `pictures` and
`chats`; the three stages are `vision_stage` (1: the tower and projector alone, with probes, then
the spread phase), `chat_stage` (2: a language model on the frozen tower) and `polish_stage` (3: the
whole model). `eval` measures the result through the host. How the settings were chosen:
README.md in this folder.
"""
from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import torch
from transformers import LlavaForConditionalGeneration

from tools.demo_model.architecture import build_model, build_processor, build_tokenizer
from tools.demo_model.chat_loop import ChatRun, quick_check
from tools.demo_model.chat_stage import train_chats
from tools.demo_model.converse_stage import converse_chats
from tools.demo_model.polish_stage import polish_chats
from tools.demo_model.vision_stage import pretrain_vision

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "models" / "tiny-llava-shapes"
# Where a saved model goes on (`--resume-at`), in order: each names the first part it has not had.
LATER_STAGES = ("spread", "chat", "polish", "converse")


def save(model, processor, out: Path) -> None:
    if out.exists():
        for path in out.iterdir():
            if path.is_file() and path.name != "README.md":  # the model card is written by hand
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    add_vision_arguments(parser)
    add_chat_arguments(parser)
    parser.add_argument("--resume-at", choices=LATER_STAGES, default="chat",
                        help="with --resume: the saved model has had stage 1's main part (spread), all of stage 1 "
                             "(chat), stage 2 too (polish) or stage 3 too (converse)")
    parser.add_argument("--resume", type=Path,
                        help="a saved model to go on from (see --resume-at): its tower is kept, and its language "
                             "model only with --resume-at polish or converse")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (the shipped weights) or cuda (quick experiments)")
    parser.add_argument("--check-every", type=int, default=300, help="quick check and checkpoint every N chat steps")
    parser.add_argument("--check-n", type=int, default=32, help="questions per kind in each quick check")
    return parser.parse_args(argv)


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    """Stage 1's settings."""
    parser.add_argument("--vision-steps", type=int, default=12000, help="stage-1 steps")
    parser.add_argument("--picture-steps", type=int, default=7000,
                        help="stage 1's last steps, with the CLS row's whole-picture probe")
    parser.add_argument("--picture-ramp", type=int, default=1000,
                        help="steps over which that probe's weight rises to 1")
    parser.add_argument("--vision-lr", type=float, default=2e-3, help="stage 1's peak learning rate")
    parser.add_argument("--vision-batch-size", type=int, default=48)
    parser.add_argument("--spread-steps", type=int, default=1500,
                        help="stage 1's last phase: every row learns what its picture holds")
    parser.add_argument("--spread-lr", type=float, default=5e-4, help="the tower's peak learning rate in that phase")


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """Stages 2, 3 and 4's settings."""
    parser.add_argument("--steps", type=int, default=4000, help="stage-2 (chat) steps")
    parser.add_argument("--polish-steps", type=int, default=3000,
                        help="stage-3 steps: the whole model on chats, two-shape descriptions weighted up")
    parser.add_argument("--polish-lr", type=float, default=5e-4, help="stage 3's peak rate for the language model")
    parser.add_argument("--polish-tower-lr", type=float, default=3e-4,
                        help="stage 3's peak rate for the tower and projector (0: frozen)")
    parser.add_argument("--converse-steps", type=int, default=1000,
                        help="stage-4 steps: the model on conversations (follow-ups about a picture in the history)")
    parser.add_argument("--converse-lr", type=float, default=5e-4, help="stage 4's peak rate for the language model")
    parser.add_argument("--converse-tower-lr", type=float, default=0.0,
                        help="stage 4's peak rate for the tower and projector (0: frozen)")
    parser.add_argument("--query-weight", type=float, default=1.0, help="stage 2's query-probe loss weight")
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)


def main(argv: list[str] | None = None) -> LlavaForConditionalGeneration:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer)
    model = build_model(tokenizer, args.seed).to(args.device)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    start = time.time()
    if args.resume is None:
        pretrain_vision(model, processor, steps=args.vision_steps, picture_steps=args.picture_steps,
                        picture_ramp=args.picture_ramp, batch_size=args.vision_batch_size, lr=args.vision_lr,
                        seed=args.seed, device=args.device)
        print(f"stage 1 done in {time.time() - start:.0f}s", flush=True)
        save(model, processor, args.out)  # the trained tower: `--resume DIR --resume-at spread` goes on from here
    else:
        model = LlavaForConditionalGeneration.from_pretrained(args.resume, dtype=torch.float32).to(args.device)
    run_later_stages(model, tokenizer, processor, args, start=start)
    print(f"trained in {time.time() - start:.0f}s")
    save(model.to("cpu"), processor, args.out)
    print(f"final quick check {quick_check(model, processor, 'cpu', args.check_n)}")
    print(f"saved to {args.out}; measure it with: python -m tools.demo_model.eval --model {args.out}")
    return model


def runs(stage: str, args: argparse.Namespace) -> bool:
    return args.resume is None or LATER_STAGES.index(stage) >= LATER_STAGES.index(args.resume_at)


def run_later_stages(model, tokenizer, processor, args: argparse.Namespace, *, start: float) -> None:
    """Stage 1's spread phase, stages 2, 3 and 4, each skipped where `--resume-at` says the saved
    model has had it; a checkpoint after each, so a long run can be split with `--resume`."""
    checkpoint = functools.partial(save, model, processor, args.out)
    run = ChatRun(batch_size=args.batch_size, device=args.device, checkpoint=checkpoint, every=args.check_every,
                  check_n=args.check_n)
    if runs("spread", args):
        # a fresh probe (its own seeds), the tower at a lower rate than the probe's new heads
        pretrain_vision(model, processor, steps=args.spread_steps, picture_steps=args.spread_steps, picture_ramp=1,
                        batch_size=args.vision_batch_size, lr=args.spread_lr, seed=args.seed + 10,
                        device=args.device, every_row=True, head_lr=args.vision_lr)
        print(f"stage 1's spread phase done in {time.time() - start:.0f}s", flush=True)
        checkpoint()  # `--resume DIR` runs stage 2 from here
    if runs("chat", args):
        train_chats(model, tokenizer, processor, run, steps=args.steps, lr=args.lr, seed=args.seed,
                    query_weight=args.query_weight)
        print(f"stage 2 done in {time.time() - start:.0f}s", flush=True)
        if args.polish_steps or args.converse_steps:
            checkpoint()  # `--resume DIR --resume-at polish` runs stage 3 from here
    if runs("polish", args) and args.polish_steps:
        polish_chats(model, tokenizer, processor, run, steps=args.polish_steps, lr=args.polish_lr,
                     tower_lr=args.polish_tower_lr, seed=args.seed)
        print(f"stage 3 done in {time.time() - start:.0f}s", flush=True)
        if args.converse_steps:
            checkpoint()  # `--resume DIR --resume-at converse` runs stage 4 from here
    if args.converse_steps:
        converse_chats(model, tokenizer, processor, run, steps=args.converse_steps, lr=args.converse_lr,
                       tower_lr=args.converse_tower_lr, seed=args.seed)


if __name__ == "__main__":
    main()
