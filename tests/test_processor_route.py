"""The pieces that serve image-text families inside text-generation-webui, checked here where they fail fast.

The end-to-end proof is `tools/check_in_tgw.sh` (every family inside text-generation-webui 1dcde41d at
its own pins, reply tokens against Hugging Face's). Here:
- `image_text`: the text each family's chat template writes for one image, against the templates the
  checkpoints were built with (written out in fixtures/vlm_families.py, not derived);
- `processor_inputs`: a tagged prompt gives what Hugging Face's processor (`fixtures/hf_reference.py`)
  gives for that template text and those pictures, and the BOS rule;
- `pil_image_processor_by_name`: the image processor found by class name (transformers 5.6's route)
  processes pixels exactly as the one transformers' own processor loads;
- `register_image_text_classes`: `AutoModelForCausalLM` then loads the full image-text class;
- `custom_generate_reply` exists only where the host does not build generate()'s inputs itself.
"""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from extensions.multimodal.core.image_codec import store_image
from extensions.multimodal.pipelines.hf_auto.image_tokens import image_text
from extensions.multimodal.pipelines.hf_auto.processor_route import processor_inputs, with_bos_rule
from extensions.multimodal.core.processor_loading import load_processor, pil_image_processor_by_name
from fixtures import hf_reference
from fixtures.vlm_families import TEMPLATE_IMAGE_TEXT


def picture(seed: int, size=(64, 48)) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size[1], size[0], 3), generator=generator,
                                         dtype=torch.uint8).numpy())


def tag(image: Image.Image) -> str:
    return store_image(image).tag  # lossless PNG: the pixels come back as sent


@pytest.mark.parametrize("family", sorted(TEMPLATE_IMAGE_TEXT))
def test_image_text_is_what_the_chat_template_writes_for_one_image(family_folder, family):
    assert image_text(load_processor(family_folder(family))) == TEMPLATE_IMAGE_TEXT[family]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "llava_onevision", "idefics3"])
def test_a_tagged_prompt_gives_the_processors_own_inputs(family_folder, family):
    processor = load_processor(family_folder(family))
    pictures = [picture(1), picture(2, (40, 72))]
    prompt = f"Look: {tag(pictures[0])} and {tag(pictures[1])}. Which is brighter?"
    ours = processor_inputs(processor, prompt, add_bos=False, max_pixels=10**8)
    text = prompt.replace(tag(pictures[0]), TEMPLATE_IMAGE_TEXT[family]).replace(
        tag(pictures[1]), TEMPLATE_IMAGE_TEXT[family])
    # transformers' own processor as apply_chat_template(tokenize=True) calls it: one conversation's
    # pictures; no template BOS
    theirs = hf_reference.load(family_folder(family))(text=[text], images=[pictures], return_tensors="pt")
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    other = processor_inputs(processor, prompt.replace(tag(pictures[1]), tag(picture(3, (40, 72)))), False, 10**8)
    assert not torch.equal(other["pixel_values"], ours["pixel_values"]), "the pictures did not reach the processor"


def test_bos_rule_is_text_generation_webuis():
    assert with_bos_rule("<bos><bos>hi", "<bos>", add_bos=False) == "<bos>hi"
    assert with_bos_rule("hi", "<bos>", add_bos=True) == "<bos>hi"
    assert with_bos_rule("hi", "<bos>", add_bos=False) == "hi"
    assert with_bos_rule("<bos>hi", "<bos>", add_bos=True) == "<bos>hi"
    assert with_bos_rule("hi", None, add_bos=True) == "hi"


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3", "mistral3", "internvl", "gemma3"])
def test_the_image_processor_found_by_name_processes_pixels_as_autoimageprocessor_does(family_folder, family):
    folder = family_folder(family)
    by_name, auto = pil_image_processor_by_name(folder), hf_reference.load(folder).image_processor
    assert type(by_name) is type(auto)
    ours, theirs = by_name(images=[picture(4)], return_tensors="pt"), auto(images=[picture(4)], return_tensors="pt")
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_registration_lets_automodelforcausallm_load_the_full_image_text_class(family_folder):
    from transformers import AutoModelForCausalLM

    from extensions.multimodal.pipelines.hf_auto.auto_classes import register_image_text_classes

    folder = family_folder("qwen2_5_vl")
    registered = register_image_text_classes()
    assert {"qwen2_5_vl", "llava", "smolvlm", "mllama"} <= set(registered) and "gemma3" not in registered
    assert type(AutoModelForCausalLM.from_pretrained(folder)).__name__ == "Qwen2_5_VLForConditionalGeneration"


def test_this_host_keeps_its_own_generation(host, family_folder):
    """This host builds generate()'s inputs itself: the extension takes over nothing here."""
    host.load(family_folder("qwen2_5_vl"), argv=["--extensions", "multimodal"])
    from extensions.multimodal import script

    assert not script.serving.processor_route(script.params) and not hasattr(script, "custom_generate_reply")
    assert script.served_model.embedder(script.params).pipeline.name() == "transformers"


def test_without_a_chat_template_the_processors_placeholder_stands_for_an_image(family_folder):
    processor = load_processor(family_folder("llava_next"))
    processor.chat_template = None  # an older llava-hf folder ships none
    assert image_text(processor) == "<image>"


def test_one_bos_whether_the_template_writes_it_or_the_tokenizer_adds_it(family_folder):
    processor = load_processor(family_folder("mistral3"))  # its tokenizer adds "<s>"; its template writes it too
    bos = processor.tokenizer.bos_token_id
    for prompt in (f"[INST]{tag(picture(5))}hi[/INST]", f"<s>[INST]{tag(picture(5))}hi[/INST]",
                   f"<s><s>[INST]{tag(picture(5))}hi[/INST]"):
        for add_bos in (False, True):
            ids = processor_inputs(processor, prompt, add_bos, 10**8)["input_ids"][0].tolist()
            assert ids[0] == bos and ids[1] != bos, (prompt[:12], add_bos)
    no_bos = load_processor(family_folder("qwen2_5_vl"))  # defines no BOS: nothing is added
    ids = processor_inputs(no_bos, f"<|im_start|>user\n{tag(picture(5))}<|im_end|>", True, 10**8)["input_ids"][0]
    assert ids[0] == no_bos.tokenizer.convert_tokens_to_ids("<|im_start|>")


@pytest.mark.parametrize("family", ["llava_onevision", "qwen2_5_vl", "mistral3"])
def test_two_pictures_give_what_hugging_faces_own_chat_template_path_gives(family_folder, family):
    """The oracle is `apply_chat_template(..., tokenize=True)`: LLaVA-OneVision lays out two pictures of
    one conversation differently from one picture alone (no anyres tiles), and so must the route."""
    processor, reference = load_processor(family_folder(family)), hf_reference.load(family_folder(family))
    pictures = [picture(6), picture(7, (40, 72))]
    content = [{"type": "image", "image": pictures[0]}, {"type": "image", "image": pictures[1]},
               {"type": "text", "text": "Which is brighter?"}]
    theirs = hf_reference.chat_inputs(reference, [{"role": "user", "content": content}])
    rendered = hf_reference.chat_text(reference, [{"role": "user", "content": content}])
    first, rest = rendered.split(TEMPLATE_IMAGE_TEXT[family], 1)
    prompt = first + tag(pictures[0]) + rest.replace(TEMPLATE_IMAGE_TEXT[family], tag(pictures[1]), 1)
    ours = processor_inputs(processor, prompt, add_bos=False, max_pixels=10**8)
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["pixel_values"], theirs["pixel_values"])
