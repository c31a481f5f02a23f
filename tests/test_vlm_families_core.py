"""The family core against Hugging Face's own `generate(**processor(...))`, per family.

Each family's tiny checkpoint (tests/vlm_families.py) is loaded as a user's folder would be
(`AutoModelForImageTextToText.from_pretrained`, `load_processor`). Our side builds the prompt the way
the extension does: the chat template's text split at each image placeholder, each text part
encoded on its own (special tokens, i.e. BOS, only on the first part, where the full encoding has
them), each image replaced by `image_token_ids`; the model input comes from `image_features` and
the family's route. The reference is `model.generate(**processor(text=chat_template(messages),
images=...))`. Greedy, float32, CPU.

Every scenario first shows that the picture matters (another picture of the same size changes the
reference reply) and that no greedy step of the reference is a near-tie.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from PIL import Image

from extensions.multimodal.pipelines.hf_auto import cross_attention, routes
from extensions.multimodal.pipelines.hf_auto import image_features as features_mod
from extensions.multimodal.pipelines.hf_auto.image_features import image_features
from extensions.multimodal.pipelines.hf_auto.image_tokens import (image_placeholder, image_token_id, image_token_ids,
                                                                  process_images)
from extensions.multimodal.processor_loading import load_processor
from tests import vlm_families

NEW_TOKENS = 8
MIN_GAP = 1e-3  # top-two logit gap below which a greedy step could flip on harmless float noise


# -- Fixtures --------------------------------------------------------------------------------------

@dataclass
class Family:
    name: str
    model: object
    processor: object
    route: str


@functools.cache
def family(name: str, family_folder: Callable[[str], Path]) -> Family:
    from transformers import AutoModelForImageTextToText

    path = family_folder(name)  # the session's shared folder (tests/conftest.py)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return Family(name, model, load_processor(path, use_torchvision=False), routes.route_for(model))


def picture(width: int, height: int, seed: int) -> Image.Image:
    """A deterministic picture: random coloured blocks (about 8 pixels each), so features vary a lot."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (max(height // 8, 1), max(width // 8, 1), 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(blocks.numpy()).resize((width, height), Image.NEAREST)


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "image"} if isinstance(p, Image.Image) else {"type": "text", "text": p}
                                        for p in parts]}


def images_of(messages: list[dict], pictures: dict) -> list[Image.Image]:
    return [p for m in messages for p in pictures.get(id(m), [])]


# -- The two sides ---------------------------------------------------------------------------------

def chat_text(fam: Family, messages: list[dict]) -> str:
    return fam.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def reference(fam: Family, text: str, images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hugging Face's prompt ids `(n,)`, greedy reply ids and per-step top-two logit gaps."""
    inputs = fam.processor(text=text, images=images or None, return_tensors="pt")
    out = fam.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    logits = torch.stack(out.logits)[:, 0]  # (steps, vocab)
    top2 = logits.topk(2, dim=-1).values
    prompt = inputs["input_ids"][0]
    return prompt, out.sequences[0, prompt.numel():], top2[:, 0] - top2[:, 1]


def prompt_ids(fam: Family, text: str, images: list[Image.Image], add_special_tokens: bool = True):
    """The extension's way: split at placeholders, encode text parts alone, image ids in between.

    `add_special_tokens`: whether the first part gets the tokenizer's special tokens (its BOS), as
    `processor(text=...)` does; `apply_chat_template(tokenize=True)` does not (the template writes BOS).
    """
    tokenizer = fam.processor.tokenizer
    parts = text.split(image_placeholder(fam.processor))
    assert len(parts) == len(images) + 1
    processed = process_images(fam.processor, images) if images else None
    tokens = processed.tokens if processed else []
    # Plain text the processor writes around an image's special tokens goes with its neighbours.
    texts = [(tokens[i - 1].after if i else "") + part + (tokens[i].before if i < len(tokens) else "")
             for i, part in enumerate(parts)]
    pieces = [tokenizer(texts[0], add_special_tokens=add_special_tokens, return_tensors="pt")["input_ids"][0]]
    for image, part in zip(tokens, texts[1:]):
        pieces += [image.ids, tokenizer(part, add_special_tokens=False, return_tensors="pt")["input_ids"][0]]
    return torch.cat(pieces), processed


@dataclass
class Conversation:
    """Our side of a chat: optionally a prefix KV cache kept from the previous turn, as the host does."""
    fam: Family
    use_cache: bool
    route: str | None = None  # None: the family's own route
    cache: object = None
    cached_embeds: torch.Tensor | None = None  # (tokens, hidden) the cache's rows stand for
    cached_ids: torch.Tensor | None = None  # (tokens,) the ids they stand for (Mllama compares these)
    cached_images: list[bytes] = field(default_factory=list)  # Mllama: whose states its cross-attention holds
    reused: list[int] = field(default_factory=list)

    def reply(self, text: str, images: list[Image.Image], add_special_tokens: bool = True):
        """Prompt ids `(n,)` and greedy reply ids for the chat template's `text` and its images."""
        fam = self.fam
        ids, processed = prompt_ids(fam, text, images, add_special_tokens)
        ids = ids[None]
        if fam.route == routes.CROSS_ATTENTION:
            kwargs, embeds = self.cross_attention_kwargs(ids, processed, images), None
        else:
            kwargs, embeds = self.row_kwargs(ids, processed)
        out = fam.model.generate(**kwargs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:] if "input_ids" in kwargs else out.sequences[0]
        if self.use_cache:
            self.remember(embeds[0] if embeds is not None else None, new, out.past_key_values)
            self.cached_ids = torch.cat([ids[0], new])
        return ids[0], new

    def row_kwargs(self, ids: torch.Tensor, processed) -> tuple[dict, torch.Tensor]:
        """The family's route for image rows; the stitched embeddings `(1, n, hidden)` key the prefix cache."""
        fam = self.fam
        rows, deepstack = features_mod.features_of(fam.model, processed) if processed else ([], None)
        embeds = routes.stitch(fam.model, ids, rows)
        grids = processed.inputs.get("image_grid_thw") if processed else None
        cache, cached_length = self.reusable(embeds[0])
        route = self.route or fam.route
        if route == routes.EMBEDS:
            kwargs = routes.embeds_kwargs(ids, embeds)
        elif route == routes.EMBEDS_MROPE:
            kwargs = routes.mrope_kwargs(fam.model, ids, embeds, grids)
        else:
            kwargs = routes.features_kwargs(fam.model, ids, rows, deepstack=deepstack, image_grid_thw=grids,
                                            cached_length=cached_length)
        if self.use_cache:
            kwargs["past_key_values"] = cache if cache is not None else routes.prefix_cache(fam.model)
        return kwargs, embeds

    def cross_attention_kwargs(self, ids: torch.Tensor, processed, images: list[Image.Image]) -> dict:
        """Mllama: the prefix is shared ids; its cross-attention keys are kept while the images are the same."""
        model = self.fam.model
        states = cross_attention.cross_attention_states(model, processed) if processed else []
        tiles = cross_attention.tiles_per_image(processed) if processed else []
        cache, cached_length, same_images = None, 0, False
        if self.use_cache and self.cache is not None:
            n = min(ids.shape[1] - 1, self.cache.get_seq_length())
            same = ids[0, :n] == self.cached_ids[:n]
            cached_length = n if bool(same.all()) else int((~same).nonzero()[0, 0])
            cache, same_images = self.cache, [i.tobytes() for i in images] == self.cached_images
            self.reused.append(cached_length)
        self.cached_images = [i.tobytes() for i in images]
        return cross_attention.cross_attention_kwargs(model, ids, states, tiles, model.config.vision_config.max_num_tiles,
                                                      cache, cached_length, same_images)

    def reusable(self, embeds: torch.Tensor):
        """The kept cache cropped to the rows shared with this prompt (at least one row left to prefill)."""
        if not self.use_cache or self.cache is None:
            return None, 0
        n = min(embeds.shape[0] - 1, self.cache.get_seq_length())
        same = (embeds[:n] == self.cached_embeds[:n]).all(-1)
        usable = n if bool(same.all()) else int((~same).nonzero()[0, 0])
        self.reused.append(usable)
        if usable == 0:
            return None, 0
        self.cache.crop(usable - self.cache.get_seq_length())  # crop takes a negative count to drop
        return self.cache, usable

    def remember(self, prompt_embeds: torch.Tensor | None, new: torch.Tensor, cache) -> None:
        self.cache = cache
        if prompt_embeds is None:
            return
        with torch.inference_mode():
            reply_embeds = self.fam.model.get_input_embeddings()(new[None])[0]
        self.cached_embeds = torch.cat([prompt_embeds, reply_embeds])


# -- Checks ----------------------------------------------------------------------------------------

def check_turn(fam: Family, conversation: Conversation, messages: list[dict], images: list[Image.Image],
               other_images: list[Image.Image]) -> torch.Tensor:
    """One turn: the picture matters, no near-tie, same ids and same reply as Hugging Face."""
    text = chat_text(fam, messages)
    ref_ids, ref_new, gaps = reference(fam, text, images)
    _, other_new, _ = reference(fam, text, other_images)
    assert not torch.equal(ref_new, other_new), f"{fam.name}: another picture gives the same reply"
    assert float(gaps.min()) > MIN_GAP, f"{fam.name}: a greedy step is a near-tie (gaps {gaps.tolist()})"
    ids, new = conversation.reply(text, images)
    assert torch.equal(ids, ref_ids), f"{fam.name}: prompt ids differ from the processor's"
    assert torch.equal(new, ref_new), f"{fam.name}: reply {new.tolist()} != Hugging Face's {ref_new.tolist()}"
    return new


FAMILY_NAMES = list(vlm_families.FAMILIES)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_image(name, family_folder):
    fam = family(name, family_folder)
    image, other = picture(64, 48, seed=1), picture(64, 48, seed=2)
    check_turn(fam, Conversation(fam, use_cache=False), [user(image, "What is in the picture?")], [image], [other])


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_two_images_of_different_sizes(name, family_folder):
    fam = family(name, family_folder)
    first, second = picture(64, 48, seed=3), picture(40, 72, seed=4)
    other = picture(40, 72, seed=5)
    messages = [user(first, second, "Which image is larger?")]
    check_turn(fam, Conversation(fam, use_cache=False), messages, [first, second], [first, other])


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_three_turns_new_image_on_turn_three(name, use_cache, family_folder):
    """Turn 1 has a picture, turn 2 none, turn 3 a new one; every picture is embedded each turn."""
    three_turns(Conversation(family(name, family_folder), use_cache=use_cache))


ROW_FAMILIES = [name for name in FAMILY_NAMES if routes.ROUTES[name] in (routes.EMBEDS, routes.EMBEDS_MROPE)]


@pytest.mark.parametrize("name", ROW_FAMILIES)
def test_ids_and_features_route_fits_every_row_family(name, family_folder):
    """`input_ids` + `mm_encoder_outputs` (Gemma 3's route) is exact for the embeds families too, prefix cache on."""
    three_turns(Conversation(family(name, family_folder), use_cache=True, route=routes.IDS_FEATURES))


def three_turns(conversation: Conversation) -> None:
    fam = conversation.fam
    first, third = picture(64, 48, seed=6), picture(48, 48, seed=7)
    other = picture(48, 48, seed=8)
    turns = [(user(first, "What is in the picture?"), [first], [picture(64, 48, seed=9)]),
             (user("And the colours?"), [first], [picture(64, 48, seed=9)]),
             (user(third, "Describe this one."), [first, third], [first, other])]
    messages: list[dict] = []
    for message, images, other_images in turns:
        messages.append(message)
        new = check_turn(fam, conversation, messages, images, other_images)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": fam.processor.decode(
            new, skip_special_tokens=True)}]})
    if conversation.use_cache:
        assert all(n > 0 for n in conversation.reused), f"{fam.name}: the cache was not reused ({conversation.reused})"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_public_functions_agree_with_one_processor_run(name, family_folder):
    """`image_token_ids` and `image_features` (each runs the processor) give what one `process_images` run gives."""
    fam = family(name, family_folder)
    images = [picture(64, 48, seed=1), picture(40, 72, seed=2)]
    processed = process_images(fam.processor, images)
    ids = image_token_ids(fam.processor, images)
    assert [t.ids.tolist() for t in ids] == [t.ids.tolist() for t in processed.tokens]
    if fam.route == routes.CROSS_ATTENTION:
        return
    rows = image_features(fam.model, fam.processor, images)
    assert [r.shape for r in rows] == [(int((t.ids == image_token_id(fam.model)).sum()), r.shape[-1])
                                       for t, r in zip(ids, rows)]
    assert all(torch.equal(a, b) for a, b in zip(rows, features_mod.features_of(fam.model, processed)[0]))


def test_row_count_mismatch_names_both_counts(family_folder):
    fam = family("qwen2_5_vl", family_folder)
    ids, processed = prompt_ids(fam, chat_text(fam, [user(picture(64, 48, seed=1), "Hi")]), [picture(64, 48, seed=1)])
    rows, _ = features_mod.features_of(fam.model, processed)
    with pytest.raises(ValueError, match=r"tokens 12, feature rows 11"):
        routes.stitch(fam.model, ids[None], [rows[0][:-1]])


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_image_against_apply_chat_template(name, family_folder):
    """The other Hugging Face convention: `apply_chat_template(tokenize=True)` adds no special tokens when
    the rendered text starts with BOS, so a template that writes BOS gets one, where
    `processor(text=template text)` gets two (Gemma 3, Mistral3, Idefics3, Aya Vision, Mllama). The
    same rule on the first text part matches it."""
    fam = family(name, family_folder)
    image = picture(64, 48, seed=1)
    messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": "What is in the picture?"}]}]
    inputs = fam.processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                               add_generation_prompt=True)
    ref = fam.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    text, bos = chat_text(fam, messages), fam.processor.tokenizer.bos_token
    starts_with_bos = bos is not None and text.startswith(bos)
    ids, new = Conversation(fam, use_cache=False).reply(text, [image], add_special_tokens=not starts_with_bos)
    assert torch.equal(ids, inputs["input_ids"][0]) and torch.equal(new, ref)


def test_gemma3_text_around_the_image_goes_with_its_neighbours(family_folder):
    """Gemma 3 writes "\\n\\n" around an image; encoded apart from the template's own "\\n" it splits
    differently (here "\\n" + "\\n\\n" against the processor's "\\n\\n" + "\\n"), so it must join the text parts."""
    fam = family("gemma3", family_folder)
    image = picture(64, 48, seed=1)
    text = chat_text(fam, [user(image, "What is in the picture?")])
    reference_ids = fam.processor(text=text, images=[image], return_tensors="pt")["input_ids"][0]
    tokens = process_images(fam.processor, [image]).tokens[0]
    assert tokens.before == tokens.after == "\n\n"
    before, after = text.split(image_placeholder(fam.processor))
    encode = functools.partial(fam.processor.tokenizer, return_tensors="pt")
    naive = torch.cat([encode(before)["input_ids"][0], encode(tokens.before, add_special_tokens=False)["input_ids"][0],
                       tokens.ids, encode(tokens.after + after, add_special_tokens=False)["input_ids"][0]])
    assert not torch.equal(naive, reference_ids)
    assert torch.equal(prompt_ids(fam, text, [image])[0], reference_ids)


def test_features_for_a_cache_that_ends_inside_an_image_keep_only_the_uncached_rows():
    features = [torch.arange(6.0).reshape(3, 2), torch.arange(6.0, 10.0).reshape(2, 2)]
    per_image = routes.encoder_output(features, None, skip=4, model_type="qwen2_5_vl")
    assert [t.tolist() for t in per_image.pooler_output] == [[[8.0, 9.0]]]
    joined = routes.encoder_output(features, None, skip=2, model_type="gemma3")
    assert joined.pooler_output.tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    assert routes.encoder_output(features, None, skip=5, model_type="gemma3") is None
