"""A prompt with pictures as the checkpoint's own processor takes it: `model.generate(**inputs)`.

For hosts that build `generate()`'s inputs themselves and take only ids or `inputs_embeds` from an
extension (text-generation-webui). There the exact route is Hugging Face's own: the prompt's text,
each picture's place written as the model's chat template writes one image part, goes through the
processor with the pictures, and `generate` gets everything the processor returns (pixels, Qwen's
grid, Gemma 3's token types, ...). The tower runs inside `generate`, as in Hugging Face's example.

In: the host's rendered prompt with the history's `<img src="data:...">` tags, its BOS setting.
Out: a `BatchFeature` (`input_ids` `(1, n)`, `attention_mask`, the family's image tensors).
Nothing here knows the host; nothing here generates.
"""
from __future__ import annotations

import weakref
from typing import Optional

from jinja2 import TemplateError
from transformers.feature_extraction_utils import BatchFeature

from extensions.multimodal.image_codec import IMAGE_TAG_RE, image_label, tag_b64_to_image

from .image_tokens import image_placeholder

PROBE = "\u2063probe\u2063"  # text no template writes by itself
_image_texts: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()


def image_text(processor) -> str:
    """The text the checkpoint's chat template writes for one image part.

    E.g. "<image>\\n" (llava-hf), "<|vision_start|><|image_pad|><|vision_end|>" (Qwen),
    "<start_of_image>" (Gemma 3): what a user message with one picture renders to, less what the
    same message without the picture renders to. A checkpoint without a chat template that takes
    image parts gets its processor's image placeholder.
    """
    if processor not in _image_texts:
        try:
            written = template_image_text(processor)
        except (TemplateError, TypeError, ValueError):
            written = image_placeholder(processor)
        _image_texts[processor] = written
    return _image_texts[processor]


def template_image_text(processor) -> str:
    text = [{"type": "text", "text": PROBE}]
    with_image, without = render(processor, [{"type": "image"}] + text), render(processor, text)
    start = common_prefix(with_image, without)
    end = common_prefix(with_image[start:][::-1], without[start:][::-1])
    written = with_image[start:len(with_image) - end]
    if not written.strip():
        raise ValueError(f"{type(processor).__name__}'s chat template writes nothing for an image part")
    return written


def render(processor, content: list) -> str:
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False)


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def with_bos_rule(text: str, bos_token: Optional[str], add_bos: bool) -> str:
    """text-generation-webui's BOS rule, on text: never two BOS at the start; one when `add_bos`."""
    if not bos_token:
        return text
    while text.startswith(bos_token * 2):
        text = text[len(bos_token):]
    return text if not add_bos or text.startswith(bos_token) else bos_token + text


def processor_inputs(processor, prompt: str, add_bos: bool, max_pixels: int,
                     images_kwargs: dict | None = None) -> BatchFeature:
    """The processor's tensors for `prompt`, each tag replaced by `image_text` and its picture.

    As Hugging Face's `apply_chat_template(..., tokenize=True)` calls the processor: the pictures as
    one conversation's list (LLaVA-OneVision lays out several pictures of one prompt differently
    from one alone); special tokens none when the text starts with the BOS (a template that writes
    it), else the tokenizer's own (a tokenizer that adds a BOS adds it). text-generation-webui's
    `encode()` gives the same single BOS.
    """
    pieces, images = [], []
    last = 0
    for index, match in enumerate(IMAGE_TAG_RE.finditer(prompt)):
        pieces += [prompt[last:match.start()], image_text(processor)]
        images.append(tag_b64_to_image(match.group("data"), max_pixels, image_label(index)))
        last = match.end()
    bos = processor.tokenizer.bos_token
    text = with_bos_rule("".join(pieces) + prompt[last:], bos, add_bos)
    return processor(text=[text], images=[images] if images else None,
                     add_special_tokens=not (bos and text.startswith(bos)), return_tensors="pt",
                     **(images_kwargs or {}) if images else {})
