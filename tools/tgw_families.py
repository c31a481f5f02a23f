"""Image-text family checkpoints for the text-generation-webui checks, and their Hugging Face reference.

    python tools/tgw_families.py build OUT_DIR [FAMILY ...]
        (this repository's venv) writes OUT_DIR/models/<family>/, the tiny checkpoint
        fixtures/vlm_families.py builds, saved as a user's folder, and OUT_DIR/<family>.json, the
        harness's --models-info for it.
    python tools/tgw_families.py reference REPORT.json [--invert-picture]
        (text-generation-webui's venv; run with its tree on sys.path) checks every turn of one
        harness run: the reply's token ids equal the reference, and the reference changes with
        the picture. Exit 0 when both hold for every turn.

The reference, for each turn, in instruct mode (text-generation-webui's default, and its API's):
Hugging Face's own rendering of the conversation up to that turn with content as parts, as a
user of `transformers` has it: `processor.apply_chat_template(messages, add_generation_prompt=True)`,
the first user message `[{"type": "image"}, {"type": "text", "text": question}]` (text-generation-
webui writes a message's pictures before its text), later ones text only, each assistant message the
reply text-generation-webui kept; then the processor on that text with the harness's picture, special
tokens as Hugging Face's `apply_chat_template(..., tokenize=True)` adds them (none when the text
starts with the BOS), and greedy `model.generate` with the harness's settings (its token bans, EOS
banned). In chat and chat-instruct modes the conversation is text-generation-webui's own (its chat
template wraps it), so the reference takes the prompt it built (`prompt_full`), each `<__media__>`
marker (or picture tag) replaced by the text the checkpoint's chat template writes for one image
(written here per family, not taken from the extension), and checks that the prompt holds the
user's question and one marker per picture; in chat mode its `add_bos_token` adds a missing BOS.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEDIA = "<__media__>"
FIRST_QUESTION = "What is in this picture?"  # the harness's (run_in_tgw.py)
TAG_STAND_IN = '<img src="data:image/...;base64,...">'  # how the harness writes picture tags in prompt_full
IMAGE_TEXT = {
    "llava": "<image>\n", "llava_next": "<image>\n", "llava_onevision": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "gemma3": "<start_of_image>", "mistral3": "[IMG]", "idefics3": "<image>", "smolvlm": "<image>",
    "internvl": "<IMG_CONTEXT>\n", "aya_vision": "<image>", "mllama": "<|image|>",
}


def build(out: Path, families: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from fixtures.vlm_families import FAMILIES

    (out / "hf_home").mkdir(parents=True, exist_ok=True)  # an empty offline cache: nothing is fetched
    for family in families or FAMILIES:
        folder = FAMILIES[family](out / "models" / family)
        as_on_the_hub(folder)
        template = (folder / "chat_template.jinja").read_text()
        assert IMAGE_TEXT[family].strip() in template, f"{family}: the template writes no {IMAGE_TEXT[family]!r}"
        info = {"model_name": family, "models_root": str(out / "models"), "hf_home": str(out / "hf_home"),
                "dims": "real", "num_image_embeds": 1, "projector_shape": [1, 1, 1],
                "family": family, "image_text": IMAGE_TEXT[family]}
        (out / f"{family}.json").write_text(json.dumps(info, indent=1))
        print(f"built {folder}")


def as_on_the_hub(folder: Path) -> None:
    """Config keys as the hub's folders carry them where transformers 5.2x writes newer ones:
    Pixtral's vision rope as `rope_theta` (5.2x writes `rope_parameters` with `rope_type: axial`,
    which transformers 5.6 refuses)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    vision = config.get("vision_config") or {}
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type") == "axial":
        vision.pop("rope_parameters")
        vision["rope_theta"] = rope["rope_theta"]
        path.write_text(json.dumps(config, indent=2))


def harness_picture(invert: bool, image_mode: str):
    """The picture the harness sent, as the model receives it (its tag mode sends a JPEG)."""
    from PIL import Image, ImageOps
    from run_in_tgw import make_picture

    picture = make_picture()
    picture = ImageOps.invert(picture) if invert else picture
    if image_mode != "tag":
        return picture
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=90)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


class Reference:
    def __init__(self, report: dict):
        import torch
        from transformers import AutoModelForImageTextToText

        from extensions.multimodal.core.processor_loading import load_processor

        info = report["models_info"]
        folder = Path(info["models_root"]) / info["model_name"]
        self.torch, self.image_text, self.report = torch, info["image_text"], report
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.processor = load_processor(folder)
        self.mode = (report.get("state_summary") or {}).get("mode", "instruct")
        self.add_bos = self.mode == "chat" and (report.get("state_summary") or {}).get("add_bos_token", True)
        # text-generation-webui's generate() settings: its EOS (the tokenizer's), banned with ban_eos_token
        self.eos = self.processor.tokenizer.eos_token_id
        ban_eos = (report.get("state_overrides") or {}).get("ban_eos_token", False)
        self.banned = (report.get("banned_token_ids") or []) + ([self.eos] if ban_eos else [])

    def text(self, turn: dict) -> tuple[str, int]:
        """The reference's prompt text for `turn` and its number of pictures."""
        if self.mode == "instruct":
            return self.processor.apply_chat_template(conversation(self.report, turn["turn"]), tokenize=False,
                                                      add_generation_prompt=True), 1
        prompt_full = turn["prompt_full"]
        count = prompt_full.count(MEDIA) + prompt_full.count(TAG_STAND_IN)
        missing = [q for q in questions(turn["turn"]) if q not in prompt_full]
        if missing or count != 1:
            raise SystemExit(f"FAIL turn {turn['turn']}: the prompt lost the user's words {missing} or holds "
                             f"{count} pictures, not 1: {prompt_full[-400:]!r}")
        text = prompt_full.replace(MEDIA, self.image_text).replace(TAG_STAND_IN, self.image_text)
        bos = self.processor.tokenizer.bos_token
        while bos and text.startswith(bos * 2):
            text = text[len(bos):]
        if self.add_bos and bos and not text.startswith(bos):
            text = bos + text
        return text, count

    def reply(self, turn: dict, picture, n_tokens: int) -> list[int]:
        text, count = self.text(turn)
        bos = self.processor.tokenizer.bos_token
        # Hugging Face's apply_chat_template(tokenize=True) rule: no special tokens after a template's BOS
        inputs = self.processor(text=[text], images=[[picture] * count] if count else None, return_tensors="pt",
                                add_special_tokens=not (bos and text.startswith(bos)))
        with self.torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=n_tokens, do_sample=False, eos_token_id=[self.eos],
                                      suppress_tokens=self.banned or None)
        return out[0, inputs["input_ids"].shape[-1]:].tolist()


def questions(turn: int) -> list[str]:
    """What the harness asked in turns 1 to `turn` (its own constants)."""
    from run_in_tgw import FOLLOW_UPS

    return [FIRST_QUESTION] + [FOLLOW_UPS[(k - 2) % len(FOLLOW_UPS)] for k in range(2, turn + 1)]


def conversation(report: dict, turn: int) -> list[dict]:
    """The chat up to `turn` as Hugging Face's processors take it: content as parts, the picture in
    the first message before its text, each earlier turn's reply as text-generation-webui kept it."""
    replies = {t["turn"]: t["reply"].strip() for t in report["turns"]}
    messages = []
    for k, question in enumerate(questions(turn), start=1):
        image = [{"type": "image"}] if k == 1 else []
        messages.append({"role": "user", "content": image + [{"type": "text", "text": question}]})
        if k < turn:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": replies[k]}]})
    return messages


def reference(report_path: Path, invert: bool) -> int:
    report = json.loads(report_path.read_text())
    ref = Reference(report)
    sent, other = (harness_picture(flag, report["image_mode"]) for flag in (invert, not invert))
    failed = 0
    for turn in report["turns"]:
        got = turn["reply_token_ids"]
        expected = ref.reply(turn, sent, len(got))
        changed = ref.reply(turn, other, len(got)) != expected
        verdict = "PASS" if got == expected and changed else "FAIL"
        failed += verdict == "FAIL"
        print(f"{verdict} turn {turn['turn']}: reply {got[:8]}... reference {expected[:8]}... "
              f"{'equal' if got == expected else 'DIFFERENT'}; another picture "
              f"{'changes' if changed else 'does NOT change'} the reference")
    print(f"{len(report['turns']) - failed} passed, {failed} failed")
    return 1 if failed or not report["turns"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_args = commands.add_parser("build")
    build_args.add_argument("out", type=Path)
    build_args.add_argument("families", nargs="*")
    reference_args = commands.add_parser("reference")
    reference_args.add_argument("report", type=Path)
    reference_args.add_argument("--invert-picture", action="store_true")
    args = parser.parse_args()
    if args.command == "build":
        build(args.out, args.families)
        return 0
    return reference(args.report, args.invert_picture)


if __name__ == "__main__":
    sys.exit(main())
