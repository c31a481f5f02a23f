"""The extension's caches inside today's text-generation-webui: replies equal Hugging Face's, caches on and off.

    python tools/tgw_cache_check.py HARNESS_WORK_DIR FAMILIES_DIR FAMILY...

Run with text-generation-webui's Python (the harness's `/tmp/tgw_venv_head`), with its tree on
`PYTHONPATH` beside this repository (as tools/check_in_tgw.sh runs it). For each family it starts
text-generation-webui's real server twice (`extensions/multimodal/launch.py --model FAMILY --api
--nowebui`), once with the extension's caches as shipped and once with both off
(`multimodal-embedding_cache_mb: 0`, `multimodal-prefix_cache: false`), and sends the same requests
through its OpenAI API, greedy:
1. a long chat whose pictures come on later turns: text only, then a picture, then another, then text;
2. a regenerate: the last request of that chat again;
3. a new chat after the long one, sharing its first words but with another picture.
Every reply must equal Hugging Face's own on the same conversation (content as parts, each message's
pictures before its text, as text-generation-webui orders them): `processor.apply_chat_template`, the
processor with the pictures, greedy `model.generate` with the server's token bans, decoded as the
server decodes. Exit 0 when every reply of both runs equals it.
"""
from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.tgw_server_check import data_url, free_port, start, wait_for  # noqa: E402

MAX_NEW_TOKENS = 8
SETTINGS = {"caches on": "", "caches off": "multimodal-embedding_cache_mb: 0\nmultimodal-prefix_cache: false\n"}


def pictures():
    from PIL import ImageOps
    from run_in_tgw import make_picture

    first = make_picture()
    return first, ImageOps.invert(first), first.rotate(90, expand=True)


def scenarios(first, second, third) -> list[tuple[str, list[tuple[str, list, str]]]]:
    """(name, user turns: (text, pictures)) ... each request sends the conversation up to its last turn."""
    long_chat = [("Hello, I will send you pictures.", []), ("What is in this picture?", [first]),
                 ("And in this one?", [second]), ("Which of the two is brighter?", [])]
    return [("a long chat, pictures on later turns", long_chat),
            ("a regenerate of its last turn", long_chat),
            ("a new chat after the long one", [("Hello, I will send you pictures.", []),
                                                ("What is in this picture?", [third])])]


class Reference:
    """Hugging Face's reply for a conversation, with the server's generation settings."""

    def __init__(self, folder: Path):
        import torch
        from transformers import AutoModelForImageTextToText

        from extensions.multimodal.core.processor_loading import load_processor

        self.torch = torch
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.processor = load_processor(folder)
        tokenizer = self.processor.tokenizer
        self.bans = sorted({i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])} |
                           {i for i in (tokenizer.unk_token_id, tokenizer.bos_token_id) if i is not None})

    def reply(self, turns: list, replies: list[str]) -> str:
        messages, images = [], []
        for index, (text, shown) in enumerate(turns):
            images += shown
            messages.append({"role": "user", "content": [{"type": "image"}] * len(shown) +
                             [{"type": "text", "text": text}]})
            if index < len(replies):
                messages.append({"role": "assistant", "content": [{"type": "text", "text": replies[index].strip()}]})
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        bos = self.processor.tokenizer.bos_token
        inputs = self.processor(text=[text], images=[images] if images else None, return_tensors="pt",
                                add_special_tokens=not (bos and text.startswith(bos)))
        eos = self.processor.tokenizer.eos_token_id
        with self.torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                      eos_token_id=[eos], suppress_tokens=self.bans + [eos])
        return self.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[-1]:], skip_special_tokens=True)


def ask(api: str, turns: list, replies: list[str], bans: list[int]) -> str:
    messages = []
    for index, (text, shown) in enumerate(turns):
        content = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": data_url(p)}}
                                                       for p in shown]
        messages.append({"role": "user", "content": content})
        if index < len(replies):
            messages.append({"role": "assistant", "content": replies[index]})
    body = {"messages": messages, "max_tokens": MAX_NEW_TOKENS, "do_sample": False, "temperature": 1, "top_k": 0,
            "top_p": 1, "min_p": 0, "seed": 1, "ban_eos_token": True, "mode": "instruct",
            "custom_token_bans": ",".join(map(str, bans))}
    request = urllib.request.Request(f"{api}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def check_family(work: Path, families: Path, family: str, tgw_tree: Path) -> int:
    from run_in_tgw import build_overlay

    reference, shown = Reference(families / "models" / family), pictures()
    failed = 0
    for setting, yaml in SETTINGS.items():
        tgw = build_overlay(tgw_tree, ROOT / "extensions" / "multimodal", work / "runs" / f"cache-{family}", [])
        (tgw / "user_data" / "settings.yaml").write_text(yaml)
        port, log = free_port(), work / f"cache-check-{family}-{setting.replace(' ', '-')}.log"
        process = start(tgw, families, family, port, log)
        try:
            wait_for(f"http://127.0.0.1:{port}/v1/models", process)
            failed += run_scenarios(f"http://127.0.0.1:{port}", family, setting, reference, shown)
        finally:
            process.terminate()
            process.wait(30)
    return failed


def run_scenarios(api: str, family: str, setting: str, reference: Reference, shown) -> int:
    failed, earlier = 0, {}
    for name, turns in scenarios(*shown):
        regenerate = name == "a regenerate of its last turn"
        replies: list[str] = earlier["long"][:-1] if regenerate else []
        for end in [len(turns)] if regenerate else range(1, len(turns) + 1):
            got = ask(api, turns[:end], replies, reference.bans)
            expected = reference.reply(turns[:end], replies)
            ok = got == expected and (not regenerate or got == earlier["long"][-1])
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {family}, {setting}, {name}, turn {end}: {got!r}"
                  f"{'' if ok else f' but Hugging Face says {expected!r}'}", flush=True)
            replies = replies + [got]
        earlier.setdefault("long", replies)
    return failed


def main() -> int:
    work, families, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    sys.path.insert(0, str(work))
    from run_in_tgw import unpack_tarball

    tree = unpack_tarball(work / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
    failed = sum(check_family(work, families, family, tree) for family in names)
    print(f"{'all replies equal' if not failed else f'{failed} replies differ from'} Hugging Face's, caches on and off")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
