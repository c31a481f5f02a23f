"""The family core against Hugging Face's own `generate(**processor(...))`, per family.

Each family's tiny checkpoint (fixtures/vlm_families.py) is loaded as a user's folder would be
(`AutoModelForImageTextToText.from_pretrained`; the core's `load_processor` for our side, and
transformers' own processor, `fixtures/hf_reference.py`, for the reference side). Both sides take the
prompt ids Hugging Face's processor writes for the chat template's text (`processor(text=...,
images=...)`, or `apply_chat_template(tokenize=True)` in `test_one_image_against_apply_chat_template`).
Our side adds what the extension's core computes with its own processor: each image's layout
(`image_tokens.process_images`), its feature rows (`image_features.features_of`) and the family's
route (`routes`, `cross_attention`). The reference is `model.generate(**processor(...))`. Greedy,
float32, CPU.

Each image's layout is checked on its own against the ids the processor wrote at that image's place
(`check_layouts`). Encoding the text around the images is the host's part (`prompt_encoding`),
exercised against Hugging Face through the real host in tests/test_vlm_families_host.py.

Every scenario first shows that the picture matters (another picture of the same size changes the
reference reply) and that no greedy step of the reference is a near-tie.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from PIL import Image

from extensions.multimodal.core.image_codec import make_tag
from extensions.multimodal.pipelines.hf_auto import cross_attention, routes
from extensions.multimodal.pipelines.hf_auto.image_features import features_of
from extensions.multimodal.pipelines.hf_auto.image_tokens import (ProcessedImages, image_placeholder, image_token_id,
                                                                  process_images)
from extensions.multimodal.core.processor_loading import load_processor
from extensions.multimodal.core.prompt_parts import split_prompt
from modules import prefix_cache
from fixtures import hf_reference, vlm_families

NEW_TOKENS = 8
MIN_GAP = 1e-3  # top-two logit gap below which a greedy step could flip on harmless float noise
# Processor keywords that say where each image's replacement text went, and which characters each token covers.
PLACES = {"return_text_replacement_offsets": True, "return_offsets_mapping": True}


# -- Fixtures --------------------------------------------------------------------------------------

@dataclass
class Family:
    name: str
    model: object
    processor: object  # the core's (`load_processor`): our side
    reference: object  # transformers' own (`fixtures/hf_reference.py`): Hugging Face's side
    route: str


@functools.cache
def family(name: str, family_folder: Callable[[str], Path]) -> Family:
    from transformers import AutoModelForImageTextToText

    path = family_folder(name)  # the session's shared folder (tests/conftest.py)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return Family(name, model, load_processor(path, use_torchvision=False), hf_reference.load(path),
                  routes.route_for(model))


def picture(width: int, height: int, seed: int) -> Image.Image:
    """A deterministic picture: random coloured blocks (about 8 pixels each), so features vary a lot."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (max(height // 8, 1), max(width // 8, 1), 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(blocks.numpy()).resize((width, height), Image.NEAREST)


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "image"} if isinstance(p, Image.Image) else {"type": "text", "text": p}
                                        for p in parts]}


# -- Hugging Face's side ---------------------------------------------------------------------------

# (the turn's pictures, processor keywords) -> the processor's output for the turn's prompt
HfInputs = Callable[..., dict]


def chat_text(fam: Family, messages: list[dict]) -> str:
    return hf_reference.chat_text(fam.reference, messages)


def processor_inputs(fam: Family, messages: list[dict]) -> HfInputs:
    """`processor(text=chat template text, images=...)`."""
    text = chat_text(fam, messages)
    return lambda images, **kwargs: fam.reference(text=text, images=images or None, **kwargs)


def template_inputs(fam: Family, messages: list[dict]) -> HfInputs:
    """`apply_chat_template(tokenize=True)` (`hf_reference.chat_inputs`), the turn's pictures in the messages'
    image entries, in order."""
    def inputs(images, **kwargs):
        pictures = iter(images)
        filled = [{**m, "content": [{**c, "image": next(pictures)} if c["type"] == "image" else c
                                    for c in m["content"]]} for m in messages]
        return hf_reference.chat_inputs(fam.reference, filled, **kwargs)
    return inputs


def reference(fam: Family, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's greedy reply ids and per-step top-two logit gaps."""
    out = fam.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    logits = torch.stack(out.logits)[:, 0]  # (steps, vocab)
    top2 = logits.topk(2, dim=-1).values
    return out.sequences[0, inputs["input_ids"].shape[1]:], top2[:, 0] - top2[:, 1]


def places(fam: Family, inputs, processed: ProcessedImages) -> list[torch.Tensor]:
    """Per image, the ids the processor wrote at its place in the whole prompt: the tokens inside its
    replacement text, less the plain text the layout leaves to the neighbouring text (`before`/`after`)."""
    ids, offsets = torch.as_tensor(inputs["input_ids"][0]), torch.as_tensor(inputs["offset_mapping"][0])
    replacements = inputs.get("text_replacement_offsets")
    if replacements is None:  # the processor keeps its placeholder (Mllama): one token per image
        return [ids[i:i + 1] for i in (ids == fam.model.config.image_token_id).nonzero()[:, 0]]
    entries = [entry for entry in replacements[0] if entry["type"] == "image"]
    assert len(entries) == len(processed.tokens), f"{len(entries)} images in the prompt, {len(processed.tokens)} laid out"
    found = []
    for entry, tokens in zip(entries, processed.tokens):
        assert entry["replacement"].startswith(tokens.before) and entry["replacement"].endswith(tokens.after)
        start, end = entry["new_span"][0] + len(tokens.before), entry["new_span"][1] - len(tokens.after)
        inside = (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & (offsets[:, 1] > offsets[:, 0])
        found.append(ids[inside])
    return found


def check_layouts(fam: Family, inputs, processed: ProcessedImages) -> None:
    """`process_images` lays out each image as the processor does inside the whole prompt."""
    expected = places(fam, inputs, processed)
    assert len(expected) == len(processed.tokens), f"{fam.name}: {len(expected)} image places in the prompt"
    for i, (place, tokens) in enumerate(zip(expected, processed.tokens)):
        assert torch.equal(tokens.ids, place), \
            f"{fam.name}: image {i}'s layout {tokens.ids.tolist()} != the processor's ids there {place.tolist()}"


# -- Our side --------------------------------------------------------------------------------------

def prompt_embeds(model, ids: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
    """`(1, n, hidden)`: token embeddings of `ids` `(1, n)`, image-token rows replaced by `rows` in order
    (the stitching the host does; here only the input the embeds routes take)."""
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    if rows:
        embeds[ids == image_token_id(model)] = torch.cat(rows)
    return embeds


def empty_cache(model):
    """The host's empty cache that can be cropped later."""
    return prefix_cache.new_cache(model)


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

    def reply(self, ids: torch.Tensor, processed: ProcessedImages | None, images: list[Image.Image]) -> torch.Tensor:
        """Greedy reply ids for the prompt `ids` `(1, n)` and its images (`processed`: their layouts and tensors)."""
        fam = self.fam
        if fam.route == routes.CROSS_ATTENTION:
            kwargs, embeds = self.cross_attention_kwargs(ids, processed, images), None
        else:
            kwargs, embeds = self.row_kwargs(ids, processed)
        out = fam.model.generate(**kwargs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
        # Every route passes the prompt's ids (logits processors read them), so the reply follows them.
        new = out.sequences[0, ids.shape[1]:]
        if self.use_cache:
            self.remember(embeds[0] if embeds is not None else None, new, out.past_key_values)
            self.cached_ids = torch.cat([ids[0], new])
        return new

    def row_kwargs(self, ids: torch.Tensor, processed: ProcessedImages | None) -> tuple[dict, torch.Tensor]:
        """The family's route for image rows; the prompt's embeddings `(1, n, hidden)` key the prefix cache."""
        fam = self.fam
        rows, deepstack = features_of(fam.model, processed) if processed else ([], None)
        embeds = prompt_embeds(fam.model, ids, rows)
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
            kwargs["past_key_values"] = cache if cache is not None else empty_cache(fam.model)
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

def check_turn(fam: Family, conversation: Conversation, hf_inputs: HfInputs, images: list[Image.Image],
               other_images: list[Image.Image]) -> torch.Tensor:
    """One turn: the picture matters, no near-tie, each image laid out as Hugging Face does, same reply."""
    inputs = hf_inputs(images, return_tensors="pt")
    ref_new, gaps = reference(fam, inputs)
    other_new, _ = reference(fam, hf_inputs(other_images, return_tensors="pt"))
    assert not torch.equal(ref_new, other_new), f"{fam.name}: another picture gives the same reply"
    assert float(gaps.min()) > MIN_GAP, f"{fam.name}: a greedy step is a near-tie (gaps {gaps.tolist()})"
    processed = process_images(fam.processor, images) if images else None
    if processed is not None:
        check_layouts(fam, hf_inputs(images, **PLACES), processed)
    new = conversation.reply(inputs["input_ids"], processed, images)
    assert torch.equal(new, ref_new), f"{fam.name}: reply {new.tolist()} != Hugging Face's {ref_new.tolist()}"
    return new


FAMILY_NAMES = list(vlm_families.FAMILIES)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_image(name, family_folder):
    fam = family(name, family_folder)
    image, other = picture(64, 48, seed=1), picture(64, 48, seed=2)
    messages = [user(image, "What is in the picture?")]
    check_turn(fam, Conversation(fam, use_cache=False), processor_inputs(fam, messages), [image], [other])


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_two_images_of_different_sizes(name, family_folder):
    fam = family(name, family_folder)
    first, second = picture(64, 48, seed=3), picture(40, 72, seed=4)
    other = picture(40, 72, seed=5)
    messages = [user(first, second, "Which image is larger?")]
    check_turn(fam, Conversation(fam, use_cache=False), processor_inputs(fam, messages), [first, second],
               [first, other])


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
        new = check_turn(fam, conversation, processor_inputs(fam, messages), images, other_images)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": fam.reference.decode(
            new, skip_special_tokens=True)}]})
    if conversation.use_cache:
        assert all(n > 0 for n in conversation.reused), f"{fam.name}: the cache was not reused ({conversation.reused})"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_image_against_apply_chat_template(name, family_folder):
    """The other Hugging Face convention: `apply_chat_template(tokenize=True)` adds no special tokens when
    the rendered text starts with BOS, so a template that writes BOS gets one, where
    `processor(text=template text)` gets two (Gemma 3, Mistral3, Idefics3, Aya Vision, Mllama). The
    layouts, features and route take those ids as they are."""
    fam = family(name, family_folder)
    image, other = picture(64, 48, seed=1), picture(64, 48, seed=2)
    messages = [user(image, "What is in the picture?")]
    check_turn(fam, Conversation(fam, use_cache=False), template_inputs(fam, messages), [image], [other])


def test_row_count_mismatch_names_both_counts(family_folder):
    fam = family("qwen2_5_vl", family_folder)
    processed = process_images(fam.processor, [picture(64, 48, seed=1)])
    tokens = processed.tokens[0]
    image_id = image_token_id(fam.model)
    first = int((tokens.ids == image_id).nonzero()[0, 0])
    short = dataclasses.replace(tokens, ids=torch.cat([tokens.ids[:first], tokens.ids[first + 1:]]))
    rows = int((tokens.ids == image_id).sum())  # what the tower gives for this picture
    with pytest.raises(ValueError, match=rf"tokens {rows - 1} .*feature rows {rows}"):
        features_of(fam.model, ProcessedImages(processed.inputs, [short]))


def test_gemma3_text_around_the_image_goes_with_its_neighbours(family_folder):
    """Gemma 3 writes "\\n\\n" around an image; encoded apart from the template's own "\\n" it splits
    differently (here "\\n" + "\\n\\n" against the processor's "\\n\\n" + "\\n"). The layout keeps it
    apart (`before`/`after`), and `split_prompt` joins it to the neighbouring text parts: encoded
    with them, the prompt is the processor's."""
    fam = family("gemma3", family_folder)
    image = picture(64, 48, seed=1)
    text = chat_text(fam, [user(image, "What is in the picture?")])
    reference_ids = fam.reference(text=text, images=[image], return_tensors="pt")["input_ids"][0]
    tokens = process_images(fam.processor, [image]).tokens[0]
    assert tokens.before == tokens.after == "\n\n"

    def encode(part: str, first: bool = False) -> torch.Tensor:
        return fam.processor.tokenizer(part, add_special_tokens=first, return_tensors="pt")["input_ids"][0]

    before, after = text.split(image_placeholder(fam.processor))
    naive = torch.cat([encode(before, True), encode(tokens.before), tokens.ids, encode(tokens.after + after)])
    assert not torch.equal(naive, reference_ids)
    parts = split_prompt(text.replace(image_placeholder(fam.processor), make_tag(b"picture")), tokens.before,
                         tokens.after)
    assert [part.is_image for part in parts] == [False, True, False]
    assert torch.equal(torch.cat([encode(parts[0].text, True), tokens.ids, encode(parts[2].text)]), reference_ids)


def test_features_for_a_cache_that_ends_inside_an_image_keep_only_the_uncached_rows():
    features = [torch.arange(6.0).reshape(3, 2), torch.arange(6.0, 10.0).reshape(2, 2)]
    per_image = routes.encoder_output(features, None, skip=4, model_type="qwen2_5_vl")
    assert [t.tolist() for t in per_image.pooler_output] == [[[8.0, 9.0]]]
    joined = routes.encoder_output(features, None, skip=2, model_type="gemma3")
    assert joined.pooler_output.tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    assert routes.encoder_output(features, None, skip=5, model_type="gemma3") is None
