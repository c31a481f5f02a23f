"""Every family on a checkpoint varied on purpose, through `/v1/chat/completions`, one server per family.

The family folders of `fixtures/vlm_families.py` are re-saved with what independently built checkpoints
differ in: where the BOS comes from (the tokenizer adds it, the chat template writes it, or neither,
though the tokenizer defines one), and a pad id equal to the EOS, which the template writes into every
prompt. Each family gets one BOS style (all three styles occur), every other family the pad change.
One request sequence per server, prefix cache on: a chat with two pictures of different sizes; a new
chat with one picture (it shares only the template's first tokens); that chat's second turn; the first
chat's second turn (its prefix is no longer the cached one); the second chat's third turn with another
picture. Each reply equals Hugging Face's (`tests/test_vlm_families_host.hf_reply`: the processor's own
chat-template path on the served model); turns with pictures also show another picture changes it.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from modules import shared
from fixtures import api_helpers, vlm_families
from tests.test_vlm_families_host import api_turn, png

# The BOS a tokenizer without one gets (it is in every ChatML family's vocabulary).
CHATML_BOS = "<|endoftext|>"
BOS_STYLES = ("tokenizer", "template", "neither")
# Families whose templates write a literal start token of their own: their BOS stays as built.
LITERAL_START = ("idefics3", "smolvlm")


# Mllama's processor writes a BOS into a text that has none, so with a tokenizer that adds one too
# Hugging Face's prompt has two, which text-generation-webui's rule (never two) does not give.
STYLE = {"mllama": "neither"}


def variant(name: str) -> tuple[str | None, bool]:
    """(BOS style or None: as built, pad equal to the EOS) for family `name`, fixed per name."""
    index = list(vlm_families.FAMILIES).index(name)
    style = None if name in LITERAL_START else STYLE.get(name, BOS_STYLES[index % 3])
    return style, index % 2 == 0


def vary(folder: Path, bos_style: str | None, pad_is_eos: bool) -> Path:
    """Re-save the folder's tokenizer, template and generation config as the variant says."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if bos_style is not None:
        bos = config.get("bos_token") or CHATML_BOS
        config["bos_token"] = bos
        set_tokenizer_bos(folder / "tokenizer.json", bos if bos_style == "tokenizer" else None)
        set_template_bos(folder, bos_style == "template")
    if pad_is_eos:
        config["pad_token"] = config["eos_token"]
    config_path.write_text(json.dumps(config, indent=2))
    if pad_is_eos:
        generation_path = folder / "generation_config.json"
        generation = json.loads(generation_path.read_text())
        eos_id = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(config["eos_token"])
        generation.update(pad_token_id=eos_id, eos_token_id=eos_id)
        generation_path.write_text(json.dumps(generation, indent=2))
    return folder


def set_tokenizer_bos(path: Path, bos: str | None) -> None:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.post_processor = None if bos is None else processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.token_to_id(bos))])
    tokenizer.save(str(path))


def set_template_bos(folder: Path, writes: bool) -> None:
    for path in template_files(folder):
        template = re.sub(r"^\{\{ ?bos_token ?\}\}", "", path.read_text())
        path.write_text(("{{ bos_token }}" if writes else "") + template)


def template_files(folder: Path) -> list[Path]:
    files = [path for path in [folder / "chat_template.jinja"] if path.exists()]
    assert files, f"{folder} has no chat_template.jinja"
    return files


@pytest.mark.parametrize("name", list(vlm_families.FAMILIES))
def test_a_varied_checkpoint_through_one_server(tmp_path, family_folder, name):
    bos_style, pad_is_eos = variant(name)
    # A copy: `vary` rewrites files, and the session's folder is shared (tests/conftest.py).
    folder = vary(Path(shutil.copytree(family_folder(name), tmp_path / name)), bos_style, pad_is_eos)
    first, second, third, fourth = png(64, 48, 41), png(40, 72, 42), png(48, 48, 43), png(72, 40, 44)
    with api_helpers.serving(folder, ["multimodal"]) as api:
        check_variant(bos_style, pad_is_eos)
        chats = {"a": ([], []), "b": ([], [])}
        for chat, text, pictures in [("a", "Compare these two.", [first, second]), ("b", "What is this?", [third]),
                                     ("b", "And the colours?", []), ("a", "Which is larger?", []),
                                     ("b", "And this one?", [fourth])]:
            api_turn(api, *chats[chat], text, pictures)


def check_variant(bos_style: str | None, pad_is_eos: bool) -> None:
    """The served tokenizer is the variant asked for (so a test cannot pass on an unvaried folder)."""
    tokenizer = shared.tokenizer
    if bos_style is not None:
        adds = tokenizer("hi")["input_ids"][0] == tokenizer.bos_token_id
        assert adds == (bos_style == "tokenizer"), (bos_style, tokenizer("hi")["input_ids"])
    if pad_is_eos:
        assert tokenizer.pad_token_id == tokenizer.eos_token_id
