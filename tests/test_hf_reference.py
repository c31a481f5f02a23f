"""The tests' Hugging Face reference (`fixtures/hf_reference.py`) is transformers' own processor, used as documented.

- Each family's reference is the class its folder names, built by `AutoProcessor` where that loads
  here, and `AutoProcessor` fails exactly for the families built from parts (so a transformers release
  or a torchvision that lets it load is noticed, and the reference goes back to `AutoProcessor`).
- SmolVLM's reference goes the long way (template text, then the processor with the BOS rule); for
  every other family the long way gives what `apply_chat_template(tokenize=True)` gives, on a chat with
  several pictures and turns.
- The written-out Pixtral processor lays a picture out as rows of `[IMG]`, each ended by `[IMG_BREAK]`,
  the last by `[IMG_END]`.
"""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from fixtures import hf_reference, vlm_families

FAMILY_NAMES = list(vlm_families.FAMILIES)


def torchvision_usable() -> bool:
    try:
        import torchvision  # noqa: F401  (a build for another torch fails here)
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def picture(width: int, height: int, seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8).numpy())


def chat() -> list[dict]:
    """Two user turns with pictures of different sizes (two, then one) and a reply between them."""
    def image(width: int, height: int, seed: int) -> dict:
        return {"type": "image", "image": picture(width, height, seed)}

    return [{"role": "user", "content": [image(64, 48, 1), image(40, 72, 2), {"type": "text", "text": "Which?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "The first."}]},
            {"role": "user", "content": [image(48, 48, 3), {"type": "text", "text": "And this one?"}]}]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_reference_is_the_class_the_folder_names(family_folder, name):
    from transformers import AutoProcessor

    folder = family_folder(name)
    named = json.loads((folder / "processor_config.json").read_text())["processor_class"]
    assert type(hf_reference.load(folder)).__name__ == named
    if torchvision_usable():
        return
    try:
        AutoProcessor.from_pretrained(folder)
        loads = True
    except (OSError, ImportError):
        loads = False
    assert loads == (name not in hf_reference.FROM_PARTS), "FROM_PARTS no longer says where AutoProcessor fails"


@pytest.mark.parametrize("name", [name for name in FAMILY_NAMES if name != "smolvlm"])
def test_the_long_way_gives_what_apply_chat_template_gives(family_folder, name):
    processor = hf_reference.load(family_folder(name))
    assert hf_reference.chat_text(processor, chat()) == processor.tokenizer.apply_chat_template(
        chat(), chat_template=processor.chat_template, tokenize=False, add_generation_prompt=True)
    short, long = hf_reference.chat_inputs(processor, chat()), hf_reference.rendered_then_processed(
        processor, chat(), return_tensors="pt")
    assert sorted(short) == sorted(long)
    for key in short:
        assert torch.equal(short[key], long[key]), key


def test_smolvlm_goes_the_long_way(family_folder):
    processor = hf_reference.load(family_folder("smolvlm"))
    with pytest.raises(AttributeError, match="num_frames"):  # its own reads the missing video processor
        processor.apply_chat_template(chat(), tokenize=True, return_dict=True, add_generation_prompt=True)
    inputs = hf_reference.chat_inputs(processor, chat())
    assert inputs["pixel_values"].shape[:2] == (1, 3 * 5)  # one conversation: 3 pictures of 4 tiles + the whole


def test_the_written_out_pixtral_lays_a_picture_out_in_rows(family_folder):
    processor = hf_reference.load(family_folder("mistral3"))  # patch 8, merge 2: 16-pixel tokens, longest edge 64
    ids = processor(text="[IMG]", images=[picture(64, 48, 1)], return_tensors="pt")["input_ids"][0]
    tokens = processor.tokenizer.convert_ids_to_tokens(ids.tolist())
    row = ["[IMG]"] * 4 + ["[IMG_BREAK]"]
    assert tokens[tokens.index("[IMG]"):] == row + row + row[:-1] + ["[IMG_END]"]
