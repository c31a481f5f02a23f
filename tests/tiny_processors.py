"""Processor objects for building test checkpoints: `build(class_name, **parts)`, then `save_pretrained`.

In goes a transformers processor class name and its parts (image processor, tokenizer, chat template,
settings); out comes that class's object, which saves the folder a user's download would hold (minus
a video processor: images only). Plain `<Family>Processor(..., video_processor=None)` does not work
without torchvision in transformers 5.23, so two classes are stood in for:
- a family that declares a video processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM, InternVL,
  LLaVA-OneVision): `ProcessorMixin` checks every declared part's class, and its check for
  `VideoProcessorMixin` fails without torchvision (`VIDEO_PROCESSOR_MAPPING` is a placeholder); the
  class is used through a subclass of the same name that declares no video processor, so it saves
  no video settings (and `save_pretrained` does not touch a missing part);
- `PixtralProcessor` (Mistral 3) is a torchvision placeholder: `tests/pixtral_processor.py` stands in.

Checkpoints only: the Hugging Face reference of the tests loads folders with `tests/hf_reference.py`,
which builds these families another way (None accepted at the class check), so a fault here shows up
as a difference there. Nothing here imports the extension.
"""
from __future__ import annotations

import functools
import inspect

import transformers
from transformers.processing_utils import ProcessorMixin

from tests import pixtral_processor


def build(class_name: str, **parts) -> ProcessorMixin:
    """`class_name(**parts)` (keywords: image_processor, tokenizer, chat_template, settings), images only."""
    cls = processor_class(class_name)
    if "video_processor" in inspect.signature(cls.__init__).parameters:
        parts["video_processor"] = None  # SmolVLM's __init__ requires the argument
    return cls(**parts)


@functools.cache
def processor_class(class_name: str) -> type[ProcessorMixin]:
    """The transformers class `class_name`, or the stand-in the module docstring names."""
    try:
        cls = getattr(transformers, class_name)
        cls.get_attributes()  # a torchvision placeholder raises ImportError on any attribute
    except ImportError:
        if class_name != "PixtralProcessor":
            raise
        return pixtral_processor.PixtralProcessor
    if "video_processor" not in cls.get_attributes():
        return cls
    attributes = [name for name in cls.get_attributes() if name != "video_processor"]
    # The family's __init__ passes its video_processor (None) to ProcessorMixin by position, after the
    # image processor and tokenizer; ProcessorMixin pairs positions with the declared parts only.
    assert cls.get_attributes()[:2] == ["image_processor", "tokenizer"], cls.get_attributes()
    return type(cls.__name__, (cls,), {"__module__": cls.__module__,
                                       "get_attributes": classmethod(lambda _cls: list(attributes))})
