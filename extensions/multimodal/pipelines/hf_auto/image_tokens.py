"""The ids an image becomes in a prompt, as the checkpoint's own processor writes them.

In: a transformers processor (`loaded_model.processor()`, loaded by `processor_loading.load_processor`)
and PIL images. Out: per image, the ids its placeholder expands to: start/end markers, row breaks,
tile tokens and the repeated image token, everything the processor writes for it. Nothing here resizes or counts by hand: the
processor is run on placeholder text and its own replacement text is tokenized.

Tokens per image vary with the image in most families (Qwen's dynamic resolution, Pixtral's rows,
Idefics3/SmolVLM splitting, InternVL/Aya tiles, LLaVA-NeXT/OneVision anyres). Images go to the
processor as a flat list (each laid out on its own), or `together`, as one conversation's list,
the way `apply_chat_template(tokenize=True)` passes a conversation's pictures: LLaVA-OneVision then
lays out each of several pictures as its base tile and a newline, no anyres tiles.

Transformers 5.23 and later say what the processor wrote for each picture (its replacement offsets).
Earlier versions (text-generation-webui pins 5.6) do not: there each picture's ids come from a
processor call with that picture alone, which is exact only where they are all added tokens (the
tokenizer splits text at those, so their ids cannot depend on the text around them); a family whose
processor writes plain text with a picture (Gemma 3's "\\n\\n", Idefics3's row breaks) raises
`LayoutUnavailable` there.

Text the processor writes around an image's special tokens (Gemma 3: "\\n\\n" on each side) is
kept apart as `before` / `after`: tokenized on its own it can split differently from the
processor's whole-prompt tokenization (a tokenizer with newline-run tokens merges the template's
"\\n" with it), so it belongs to the neighbouring text parts, encoded with them.

This module knows nothing about the model's weights and nothing about the host.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from jinja2 import TemplateError
from PIL import Image
from transformers.feature_extraction_utils import BatchFeature


# The first transformers whose processors return `text_replacement_offsets`.
OFFSETS_SINCE = (5, 23)


class LayoutUnavailable(ValueError):
    """The installed transformers cannot say exactly which ids the processor writes for a picture."""


PROBE = "probe-4b1f"  # text no chat template writes by itself
IMAGE_PART = {"type": "image"}
_image_texts: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ImageTokens:
    """One image's share of the prompt: `before` + ids + `after`, in that order."""
    before: str  # plain text the processor writes before the image's first special token (usually "")
    ids: torch.Tensor  # (n,) int64: from the image's first special token to its last
    after: str  # plain text after the image's last special token (usually "")


@dataclass
class ProcessedImages:
    """The processor's output for the images of one prompt."""
    inputs: BatchFeature  # the tensors the vision tower takes (pixel_values, image_grid_thw, image_sizes, ...)
    tokens: list[ImageTokens]  # one per image, in order


def image_placeholder(processor) -> str:
    """The text that stands for one image in the processor's input, which the processor expands.

    E.g. "<image>", "<|image_pad|>" (Qwen; the template wraps it in vision start/end), "[IMG]"
    (Pixtral), "<start_of_image>" (Gemma 3: its `boi_token`; before transformers 5.2x its
    `image_token` names the soft token it expands to), "<IMG_CONTEXT>" (InternVL), "<|image|>" (Mllama).
    """
    token = getattr(processor, "boi_token", None) or getattr(processor, "image_token", None)
    if not token:
        raise ValueError(f"{type(processor).__name__} names no image_token; is this an image-text processor?")
    return token


def image_text(processor) -> str:
    """The text the checkpoint's chat template writes for one image part: a history tag in a prompt
    stands for it. E.g. "<image>\\n" (llava-hf), "<|vision_start|><|image_pad|><|vision_end|>" (Qwen),
    "<start_of_image>" (Gemma 3); the processor's placeholder (`image_placeholder`) where the checkpoint
    has no chat template that takes image parts, or one whose image text holds no placeholder."""
    if processor not in _image_texts:
        try:
            written = template_image_text(lambda content: processor.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True))
        except (TemplateError, TypeError, ValueError, LookupError):
            written = ""
        placeholder = image_placeholder(processor)
        _image_texts[processor] = written if placeholder in written else placeholder
    return _image_texts[processor]


def template_image_text(render_user: Callable[[list], str]) -> str:
    """The text one image part adds to a user message: `render_user(content)` renders a user message
    with that content. Two pictures against one, not one against none: some templates also change
    other text when a message has a picture (Llama 3.2 Vision's leaves out its default system turn)."""
    text = {"type": "text", "text": PROBE}
    one, two = render_user([IMAGE_PART, text]), render_user([IMAGE_PART, IMAGE_PART, text])
    start = common_prefix(two, one)
    end = common_prefix(two[start:][::-1], one[start:][::-1])
    return two[start:len(two) - end]


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def image_token_id(model) -> int:
    """The id whose rows the model replaces by image features (`config.image_token_id`)."""
    config = model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(model).__name__}'s config has no image_token_id / image_token_index")


def process_images(processor, images: Sequence[Image.Image], together: bool = False,
                   images_kwargs: Optional[dict] = None) -> ProcessedImages:
    """Run the processor once on the images of one prompt; their tensors and their ids.

    Images go in as given (the processor converts modes itself), one placeholder each; `together`:
    as one conversation's pictures (see the module docstring); `images_kwargs`: the image
    processor's per-call settings (a budget: `budget_kwargs`).
    """
    if not images:
        raise ValueError("process_images needs at least one image, got 0")
    images = list(images)
    text = image_placeholder(processor) * len(images)
    offsets = transformers_version() >= OFFSETS_SINCE
    inputs = processor(text=[text], images=[images] if together else images, return_tensors="pt",
                       add_special_tokens=False, **({"return_text_replacement_offsets": True} if offsets else {}),
                       **(images_kwargs or {}))
    replacements = inputs.pop("text_replacement_offsets", None)
    pattern = added_tokens_pattern(processor.tokenizer)
    if not offsets:
        tokens = tokens_one_by_one(processor, images, together, images_kwargs)
    elif replacements is None:  # the processor keeps its placeholder as is (Mllama: one <|image|> per image)
        tokens = [split_replacement(processor.tokenizer, image_placeholder(processor), pattern)] * len(images)
    else:
        strings = [entry["replacement"] for entry in replacements[0] if entry["type"] == "image"]
        tokens = [split_replacement(processor.tokenizer, string, pattern) for string in strings]
    joined = torch.cat([t.ids for t in tokens])
    if (not offsets or replacements is not None) and not any(t.before or t.after for t in tokens) \
            and not torch.equal(joined, inputs["input_ids"][0]):
        raise (LayoutUnavailable if not offsets else AssertionError)(
            f"{type(processor).__name__}: image ids tokenized one by one differ from the processor's own "
            f"({joined.numel()} vs {inputs['input_ids'].shape[-1]} ids)")
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"):
        inputs.pop(key, None)
    return ProcessedImages(inputs=inputs, tokens=tokens)


BLANK_SIDE = 224  # the picture whose layout gives a family's tokens per square image and the text around every image


@dataclass(frozen=True)
class TagText:
    """What a history tag stands for: one image part as the chat template writes it (Qwen: the placeholder
    between <|vision_start|> and <|vision_end|>). The text around the placeholder, and the plain text the
    processor writes around every image's special tokens (Gemma 3: "\n\n"), belong to the neighbouring
    text parts, encoded with them, as the processor tokenizes the whole prompt."""
    text: str  # the chat template's text for one image part
    before: str  # text parts end with it before an image
    after: str  # text parts start with it after an image
    tokens_per_image: int  # image tokens of a blank square picture; 0 where not exact here
    not_exact_here: str  # "" where each picture's ids are known exactly; else why not


def tag_text(processor, image_id: int, not_exact_here: str = "") -> TagText:
    """The tag's text for `processor`; `not_exact_here`: why the model's own features cannot serve here
    (before 5.23 a processor that writes plain text with a picture cannot say where: `LayoutUnavailable`)."""
    text = image_text(processor)
    prefix, _, suffix = text.partition(image_placeholder(processor))
    if not not_exact_here:
        try:
            blank = process_images(processor, [Image.new("RGB", (BLANK_SIDE, BLANK_SIDE))]).tokens[0]
            return TagText(text, prefix + blank.before, blank.after + suffix, int((blank.ids == image_id).sum()), "")
        except LayoutUnavailable as error:
            not_exact_here = str(error)
    return TagText(text, prefix, suffix, 0, not_exact_here)


def with_company(images: Sequence[Image.Image], several: bool) -> list[Image.Image]:
    """A lone image of a prompt holding several goes with a copy of itself, so the processor lays it
    out as one of several (what it is in its prompt); the copy's share is dropped by the caller."""
    return list(images) + list(images[:1]) if several and len(images) == 1 else list(images)


def transformers_version() -> tuple[int, int]:
    import transformers

    return tuple(int(part) for part in transformers.__version__.split(".")[:2])


def tokens_one_by_one(processor, images: Sequence[Image.Image], together: bool,
                      images_kwargs: Optional[dict]) -> list[ImageTokens]:
    """Each picture's ids, from a processor call with it alone (with a copy of itself when `together`:
    then the first half); only where every id is an added token (see the module docstring)."""
    added = set(processor.tokenizer.get_added_vocab().values())
    tokens = []
    for image in images:
        group = [image, image] if together else [image]
        ids = processor(text=[image_placeholder(processor) * len(group)], images=[group], return_tensors="pt",
                        add_special_tokens=False, **(images_kwargs or {}))["input_ids"][0]
        ids = ids[:ids.numel() // len(group)]
        if not set(ids.tolist()) <= added:
            raise LayoutUnavailable(
                f"{type(processor).__name__} writes plain text with each picture; transformers "
                f"{'.'.join(map(str, OFFSETS_SINCE))} or newer says which, this one does not.")
        tokens.append(ImageTokens(before="", ids=ids, after=""))
    return tokens


def split_replacement(tokenizer, replacement: str, pattern: re.Pattern | None = None) -> ImageTokens:
    """`replacement` as plain text before its first added token, ids up to its last, plain text after."""
    pattern = pattern or added_tokens_pattern(tokenizer)
    spans = [m.span() for m in pattern.finditer(replacement)]
    if not spans:
        raise ValueError(f"the image replacement text {replacement[:60]!r} holds no special token of the tokenizer")
    start, end = spans[0][0], spans[-1][1]
    ids = tokenizer(replacement[start:end], add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return ImageTokens(before=replacement[:start], ids=ids, after=replacement[end:])


# Per live tokenizer: (its length when built, its added-tokens pattern). Building the pattern sorts
# every added token, which costs ~0.25 s per image for a tokenizer with 30k added words.
_patterns: "weakref.WeakKeyDictionary[object, tuple[int, re.Pattern]]" = weakref.WeakKeyDictionary()


def added_tokens_pattern(tokenizer) -> re.Pattern:
    """Matches any added token (the tokenizer splits text at these before running its model)."""
    kept = _patterns.get(tokenizer)
    if kept is not None and kept[0] == len(tokenizer):
        return kept[1]
    tokens = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(token) for token in tokens))
    _patterns[tokenizer] = (len(tokenizer), pattern)
    return pattern
