"""Hugging Face's own answer to a chat with pictures: the reference side of the differential tests.

`load(folder)` gives the checkpoint's processor; `chat_inputs(processor, messages)` gives what the
processor makes of a conversation whose image parts carry the pictures (`{"type": "image", "image":
PIL.Image}`): `apply_chat_template(messages, tokenize=True, return_dict=True, add_generation_prompt=True,
return_tensors="pt")`, ready for `model.generate(**inputs)`. transformers' public API only; nothing
here imports the extension, so a fault in its loaders or rules cannot pass as Hugging Face's answer.

Loading (transformers 5.23, no torchvision; tests/test_hf_reference.py checks each family):
- `AutoProcessor.from_pretrained(folder)` wherever it loads: LLaVA, LLaVA-NeXT, Gemma 3, Idefics3,
  Aya Vision, Mllama (and every family once torchvision is usable);
- else the family's own processor class from the folder's parts, as `from_pretrained` assembles it
  (`get_processor_dict`, `from_args_and_dict`) with `AutoImageProcessor` (its PIL backend) and
  `AutoTokenizer`, and no video processor. Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM, InternVL and
  LLaVA-OneVision declare a video processor whose class needs torchvision, and `ProcessorMixin`'s
  class check refuses None for it (its lookup of `VideoProcessorMixin` fails on the placeholder
  `VIDEO_PROCESSOR_MAPPING`): the class is used through a same-named subclass whose check lets a None
  video processor through, nothing else changed. Mistral 3's `PixtralProcessor` cannot be imported
  at all (a torchvision placeholder): `fixtures/pixtral_processor.py` writes it out.

Tokenizing: SmolVLM's `apply_chat_template` reads the video processor's frame settings before it
renders, so for SmolVLM the reference is the documented equivalent: the chat template rendered by
`tokenizer.apply_chat_template(tokenize=False)`, then `processor(text, [pictures])`, adding special
tokens unless the text starts with the BOS (the rule `ProcessorMixin.apply_chat_template` applies).
"""
from __future__ import annotations

import functools
from pathlib import Path

import transformers
from transformers import AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.processing_utils import ProcessorMixin

from fixtures import pixtral_processor

# model_type -> the processor class built from parts where AutoProcessor needs torchvision.
FROM_PARTS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
              "smolvlm": "SmolVLMProcessor", "internvl": "InternVLProcessor",
              "llava_onevision": "LlavaOnevisionProcessor", "mistral3": "PixtralProcessor"}
# Processor classes whose apply_chat_template cannot tokenize without a video processor (see above).
RENDER_THEN_PROCESS = {"SmolVLMProcessor"}


def load(folder: str | Path) -> ProcessorMixin:
    """The checkpoint's processor (see the module docstring), loaded afresh when the folder's files change."""
    folder = Path(folder)
    return _load(folder, max(path.stat().st_mtime_ns for path in folder.iterdir()))


@functools.cache
def _load(folder: Path, _changed: int) -> ProcessorMixin:
    try:
        return AutoProcessor.from_pretrained(folder)
    except (OSError, ImportError) as error:  # a video processor's or Pixtral's missing torchvision
        model_type = AutoConfig.from_pretrained(folder).model_type
        if model_type not in FROM_PARTS:
            raise
        return from_parts(folder, processor_class(FROM_PARTS[model_type]), error)


def from_parts(folder: Path, cls: type[ProcessorMixin], error: Exception) -> ProcessorMixin:
    """`cls` as `from_pretrained` assembles it, with the PIL image processor and no video processor."""
    parts = {"image_processor": AutoImageProcessor.from_pretrained(folder),
             "tokenizer": AutoTokenizer.from_pretrained(folder), "video_processor": None}
    declared = cls.get_attributes()
    if not set(declared) <= set(parts):
        raise RuntimeError(f"{cls.__name__} also needs {set(declared) - set(parts)}") from error
    processor_dict, settings = cls.get_processor_dict(folder)
    return cls.from_args_and_dict([parts[name] for name in declared], processor_dict, **settings)


@functools.cache
def processor_class(class_name: str) -> type[ProcessorMixin]:
    """transformers' class `class_name` that takes a None video processor, or the written-out Pixtral."""
    if class_name == "PixtralProcessor":
        return pixtral_processor.PixtralProcessor
    cls = getattr(transformers, class_name)

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return cls.check_argument_for_proper_class(self, argument_name, argument)

    return type(cls.__name__, (cls,), {"__module__": cls.__module__,
                                       "check_argument_for_proper_class": check_argument_for_proper_class})


def chat_inputs(processor: ProcessorMixin, messages: list[dict], **processor_kwargs):
    """The processor's inputs (`input_ids` `(1, n)`, pixel tensors, ...) for `messages` with their pictures
    in the image parts; `processor_kwargs` go to the processor call (e.g. an image processor's `size`;
    `return_tensors` is "pt" unless given)."""
    kwargs = {"return_tensors": "pt", **processor_kwargs}
    if type(processor).__name__ not in RENDER_THEN_PROCESS:
        return processor.apply_chat_template(messages, tokenize=True, return_dict=True, add_generation_prompt=True,
                                             return_tensors=kwargs.pop("return_tensors"), processor_kwargs=kwargs)
    return rendered_then_processed(processor, messages, **kwargs)


def rendered_then_processed(processor: ProcessorMixin, messages: list[dict], **processor_kwargs):
    """`chat_inputs` the documented long way: the template's text, then the processor on it and the pictures."""
    tokenizer, text = processor.tokenizer, chat_text(processor, messages)
    pictures = [part["image"] for message in messages if not isinstance(message["content"], str)
                for part in message["content"] if part.get("type") == "image"]
    starts_with_bos = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
    # One conversation's pictures as one list, as apply_chat_template passes them.
    return processor(text=text, images=[pictures] if pictures else None, add_special_tokens=not starts_with_bos,
                     **processor_kwargs)


def chat_text(processor: ProcessorMixin, messages: list[dict]) -> str:
    """The processor's chat template rendered for `messages`, with the generation prompt (SmolVLM's
    through its tokenizer, which renders the same template with the same special tokens)."""
    if type(processor).__name__ in RENDER_THEN_PROCESS:
        return processor.tokenizer.apply_chat_template(messages, chat_template=processor.chat_template,
                                                       tokenize=False, add_generation_prompt=True)
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
