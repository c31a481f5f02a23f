"""`load_processor`: the checkpoint's processor with or without torchvision, and errors that name the fix.

What is compared, honestly: torchvision is not usable on this machine, so `AutoProcessor` runs on
its PIL fallback where it loads at all. For the families where it loads (LLaVA, LLaVA-NeXT, Gemma 3,
Idefics3, Aya Vision) the PIL route is compared with it: same ids, same pixel tensors. For the others
`AutoProcessor` fails here (checked, so a transformers release that fixes it is noticed); the PIL
route is then compared with the same processor class built by hand from the PIL image processor
class and the saved settings, and its image-token counts with the processor's own size arithmetic
(`_get_num_multimodal_tokens`), which reads no pixels. With torchvision usable (a GPU machine),
`test_pil_route_matches_auto_processor` compares the two backends for every family instead
(ids equal; pixels to a tolerance, torchvision and PIL resize differently) - never run here.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from extensions.multimodal.core import processor_loading as processing
from extensions.multimodal.pipelines.hf_auto.image_tokens import image_placeholder, process_images
from extensions.multimodal.core.processor_loading import ProcessorLoadError, load_processor
from fixtures import hf_reference, tiny_processors, vlm_families

# AutoProcessor.from_pretrained fails for these without torchvision (transformers 5.23).
NEEDS_TORCHVISION = set(hf_reference.FROM_PARTS)
FAMILY_NAMES = list(vlm_families.FAMILIES)


def pictures() -> list[Image.Image]:
    generator = torch.Generator().manual_seed(0)
    return [Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8).numpy())
            for w, h in [(64, 48), (40, 72)]]


def run(processor, images: list[Image.Image]) -> dict:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = hf_reference.chat_text(processor, messages)  # SmolVLM's own renders only with a video processor
    return dict(processor(text=text, images=images, return_tensors="pt"))


def assert_same_outputs(ours: dict, theirs: dict, pixel_atol: float = 0.0) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        if key.startswith("pixel_values") and pixel_atol:
            assert value.shape == ours[key].shape, key
            assert torch.allclose(ours[key].float(), value.float(), atol=pixel_atol), key
        else:
            assert torch.equal(ours[key], value), key


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_pil_route_matches_auto_processor(name, family_folder):
    from transformers import AutoProcessor

    path = family_folder(name)
    ours = load_processor(path, use_torchvision=False)
    if processing.torchvision_usable():
        assert_same_outputs(run(ours, pictures()), run(AutoProcessor.from_pretrained(path), pictures()), pixel_atol=0.1)
        return
    if name in NEEDS_TORCHVISION:
        with pytest.raises(Exception):
            AutoProcessor.from_pretrained(path)
        pytest.skip("AutoProcessor cannot load this family without torchvision; see test_pil_route_matches_hand_built")
    theirs = AutoProcessor.from_pretrained(path)
    assert type(theirs).__name__ == type(ours).__name__
    assert_same_outputs(run(ours, pictures()), run(theirs, pictures()))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_pil_route_matches_hand_built(name, family_folder):
    """The loader reads every saved setting: same outputs as the class built by hand from the saved parts."""
    import transformers

    path = family_folder(name)
    ours = load_processor(path, use_torchvision=False)
    saved = json.loads((path / "processor_config.json").read_text())
    image_config = dict(saved.pop("image_processor"))
    image_class = getattr(transformers, image_config.pop("image_processor_type") + "Pil")
    settings = {k: v for k, v in saved.items() if k != "processor_class"}
    hand_built = tiny_processors.build(
        saved["processor_class"], image_processor=image_class(**image_config),
        tokenizer=transformers.AutoTokenizer.from_pretrained(path),
        chat_template=(path / "chat_template.jinja").read_text(), **settings)
    assert_same_outputs(run(ours, pictures()), run(hand_built, pictures()))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_image_ids_count_as_the_processor_arithmetic_says(name, family_folder):
    """Image tokens per image from running the processor = its size-only arithmetic (what a counter without pixels uses)."""
    processor = load_processor(family_folder(name), use_torchvision=False)
    if not hasattr(processor, "_get_num_multimodal_tokens"):
        pytest.skip(f"{type(processor).__name__} has no size arithmetic")
    for image in pictures():  # alone in its prompt: OneVision's count assumes one image per prompt
        tokens = process_images(processor, [image]).tokens[0]
        width, height = image.size
        expected = processor._get_num_multimodal_tokens(image_sizes=[[height, width]]).num_image_tokens[0]
        image_ids = [i for i in processor.image_token_ids if i is not None]
        counted = int(torch.isin(tokens.ids, torch.tensor(image_ids)).sum())
        assert expected in (tokens.ids.numel(), counted), (expected, tokens.ids.numel(), counted)


def test_missing_num2words_names_the_fix(family_folder, monkeypatch):
    import transformers.models.smolvlm.processing_smolvlm as smolvlm

    path = family_folder("smolvlm")
    monkeypatch.setattr(smolvlm, "num2words", None)
    with pytest.raises(ProcessorLoadError, match="pip install num2words"):
        load_processor(path, use_torchvision=False)


def test_a_folder_without_a_processor_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ProcessorLoadError, match="image-text checkpoint"):
        load_processor(tmp_path, use_torchvision=False)


def test_video_free_processor_keeps_its_name_and_round_trips(family_folder, tmp_path):
    """The subclass without a video processor saves a folder that loads back to the same outputs."""
    ours = load_processor(family_folder("qwen2_5_vl"), use_torchvision=False)
    assert type(ours).__name__ == "Qwen2_5_VLProcessor" and not hasattr(ours, "video_processor")
    ours.save_pretrained(tmp_path)
    again = load_processor(tmp_path, use_torchvision=False)
    assert_same_outputs(run(again, pictures()), run(ours, pictures()))


def test_pixtral_without_torchvision_leaves_transformers_as_it_was():
    before = {name for name in sys.modules if name.startswith(processing.PIXTRAL)}
    cls = processing.pixtral_processor_class()
    after = {name for name in sys.modules if name.startswith(processing.PIXTRAL)}
    assert cls.__name__ == "PixtralProcessor"
    assert f"{processing.PIXTRAL}.image_processing_pixtral" not in after - before  # no stand-in left behind


def test_pixtral_size_helper_is_the_same_function_in_both_modules():
    """The PIL module's helper that the private Pixtral module uses is the torchvision module's, line for line."""
    import importlib.util

    def function_ast(module_name: str) -> str:
        source = Path(importlib.util.find_spec(module_name).origin).read_text()
        node = next(n for n in ast.parse(source).body
                    if isinstance(n, ast.FunctionDef) and n.name == "get_resize_output_image_size")
        return ast.dump(node)

    assert function_ast(f"{processing.PIXTRAL}.image_processing_pixtral") == \
        function_ast(f"{processing.PIXTRAL}.image_processing_pil_pixtral")


def test_placeholders_are_what_the_chat_templates_write(family_folder):
    for name in FAMILY_NAMES:
        processor = load_processor(family_folder(name), use_torchvision=False)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.count(image_placeholder(processor)) == 1, (name, text)


def test_a_folder_without_a_video_processor_serves_pictures_where_torchvision_is_installed(family_folder, monkeypatch):
    """Where torchvision runs, AutoProcessor requires a video processor that a folder saved without torchvision
    lacks (an H200 with torchvision: "Can't load video processor ..."); its pictures need only the parts.
    transformers' own error is raised here as it is there: this machine has no torchvision to raise it."""
    folder = family_folder("qwen2_5_vl")
    expected = load_processor(folder, use_torchvision=False)

    def without_video_config(path, *args, **kwargs):
        raise OSError(f"Can't load video processor for '{path}'. If you were trying to load it from "
                      f"'https://huggingface.co/models', make sure you don't have a local directory with the same name.")

    monkeypatch.setattr(processing, "torchvision_usable", lambda: True)
    monkeypatch.setattr(processing.AutoProcessor, "from_pretrained", without_video_config)
    ours = load_processor(folder)
    assert not hasattr(ours, "video_processor")
    assert_same_outputs(run(ours, pictures()), run(expected, pictures()))
    monkeypatch.setattr(processing.AutoProcessor, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("disk read error")))
    with pytest.raises(OSError, match="disk read error"):  # any other failure still says what it is
        load_processor(folder)
