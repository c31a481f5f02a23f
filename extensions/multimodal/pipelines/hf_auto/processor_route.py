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

from typing import Optional

from transformers.feature_extraction_utils import BatchFeature

from extensions.multimodal.core.image_codec import find_tags, image_label, tag_b64_to_image

from .image_tokens import image_text


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
    for index, tag in enumerate(find_tags(prompt)):
        pieces += [prompt[last:tag.start], image_text(processor)]
        images.append(tag_b64_to_image(tag.data, max_pixels, image_label(index)))
        last = tag.end
    bos = processor.tokenizer.bos_token
    text = with_bos_rule("".join(pieces) + prompt[last:], bos, add_bos)
    return processor(text=[text], images=[images] if images else None,
                     add_special_tokens=not (bos and text.startswith(bos)), return_tensors="pt",
                     **(images_kwargs or {}) if images else {})
