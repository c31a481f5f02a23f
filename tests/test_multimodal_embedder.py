"""MultimodalEmbedder: splitting, truncation, lengths, stitching, placeholder images, the caches.

The pipeline is a real (tiny) one on the fixture Llama (tests/multimodal_fake_pipeline.py); its
text and image embeddings are the oracle the stitched output is compared with.
"""
from __future__ import annotations

import hashlib
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extensions.multimodal.core import image_codec, prompt_encoding
from extensions.multimodal.core.bounded_lru import BoundedLRU
from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, tag_b64_to_image
from extensions.multimodal.core.multimodal_embedder import EmbeddingCountError
from extensions.multimodal.core.prompt_parts import split_prompt
from modules import shared
from modules.text_generation import encode
from tests.multimodal_fake_pipeline import make_embedder as make, encoded, noise_image, solid_image, tag, tag_of_bytes

IMG = [tag(noise_image(seed)) for seed in range(4)]


def state(**overrides) -> dict:
    return {"add_bos_token": True, "truncation_length": 1024, "max_new_tokens": 16, **overrides}


def ids_of(text: str, bos: bool = False) -> list[int]:
    return encode(text, add_special_tokens=bos, add_bos_token=bos)[0].tolist()


def token(name: str) -> int:
    return shared.tokenizer.convert_tokens_to_ids(name)


# -- Splitting ------------------------------------------------------------------------------------

def texts(parts) -> list:
    return [("IMG", p.index) if p.is_image else p.text for p in parts]


def test_split_of_the_technical_description_example():
    parts = split_prompt(f"text1{IMG[0]}text2{IMG[1]}text3", "<Img>", "</Img>")
    assert texts(parts) == ["text1<Img>", ("IMG", 0), "</Img>text2<Img>", ("IMG", 1), "</Img>text3"]
    assert parts[1].text == IMG[0] and parts[3].text == IMG[1]
    assert parts[1].b64 in IMG[0]


def test_split_without_images_is_one_text_part():
    assert texts(split_prompt("just text", "<Img>", "</Img>")) == ["just text"]
    assert texts(split_prompt("", "<Img>", "</Img>")) == [""]


def test_split_with_one_and_three_images():
    assert texts(split_prompt(f"a{IMG[0]}b", "<Img>", "</Img>")) == ["a<Img>", ("IMG", 0), "</Img>b"]
    parts = split_prompt(f"a{IMG[0]}b{IMG[1]}c{IMG[2]}d", "<Img>", "</Img>")
    assert texts(parts) == ["a<Img>", ("IMG", 0), "</Img>b<Img>", ("IMG", 1), "</Img>c<Img>", ("IMG", 2), "</Img>d"]


def test_split_images_at_the_start_the_end_and_adjacent():
    assert texts(split_prompt(f"{IMG[0]}after", "<Img>", "</Img>")) == ["<Img>", ("IMG", 0), "</Img>after"]
    assert texts(split_prompt(f"before{IMG[0]}", "<Img>", "</Img>")) == ["before<Img>", ("IMG", 0), "</Img>"]
    assert texts(split_prompt(f"{IMG[0]}{IMG[1]}", "<Img>", "</Img>")) == \
        ["<Img>", ("IMG", 0), "</Img><Img>", ("IMG", 1), "</Img>"]


def test_split_without_markers():
    assert texts(split_prompt(f"a{IMG[0]}b", None, None)) == ["a", ("IMG", 0), "b"]


def test_embedder_split_uses_the_pipeline_markers_and_keeps_the_image_as_sent(llama):
    parts = make("fake-img-markers").prompts.split(f"text1{IMG[0]}text2")
    assert texts(parts) == ["text1<Img>", ("IMG", 0), "</Img>text2"]
    assert parts[1].b64 in IMG[0]


# -- Ids, lengths and truncation -------------------------------------------------------------------

def test_ids_are_text_then_placeholders_with_one_bos(llama):
    embedder = make("fake-img-markers")
    result = embedder.forward(f"text1{IMG[0]}text2{IMG[1]}text3", state())
    ids = result.input_ids
    embeds = result.inputs_embeds
    n_images = result.images
    placeholder = [token("<image>")] * 4
    expected = (ids_of("text1<Img>", bos=True) + placeholder + ids_of("</Img>text2<Img>") + placeholder +
                ids_of("</Img>text3"))
    assert ids.tolist() == expected and ids.dtype == torch.int64
    assert ids.tolist().count(shared.tokenizer.bos_token_id) == 1
    assert embeds.shape == (len(expected), 64) and n_images == 2


def test_no_bos_forced_when_the_state_says_so(llama):
    """add_bos_token=False forces none: the first part is encoded as the host encodes a prompt (this
    tokenizer adds its own BOS, which text-generation-webui keeps too); none is doubled or repeated."""
    embedder = make()
    result = embedder.forward(f"hi{IMG[0]}there", state(add_bos_token=False))
    ids = result.input_ids
    first = encode("hi", add_bos_token=False)[0].tolist()
    assert ids.tolist()[:len(first)] == first and ids.tolist().count(shared.tokenizer.bos_token_id) == first.count(
        shared.tokenizer.bos_token_id) <= 1


@pytest.mark.parametrize("prompt", ["no images at all", f"{IMG[0]}", f"a{IMG[0]}b", f"a{IMG[0]}{IMG[1]}b{IMG[2]}",
                                    f"USER: {IMG[3]}\nWhat is it?\nASSISTANT:"])
@pytest.mark.parametrize("add_all", [False, True])
def test_len_in_tokens_equals_forward_length(llama, prompt, add_all):
    embedder = make(add_all_images_to_prompt=add_all)
    result = embedder.forward(prompt, state())
    ids = result.input_ids
    embeds = result.inputs_embeds
    assert embedder.len_in_tokens(prompt) == ids.shape[0] == embeds.shape[0]


def test_len_in_tokens_with_a_per_image_token_count(llama):
    portrait, landscape = tag(noise_image(5, (16, 32))), tag(noise_image(6, (32, 16)))
    embedder = make("fake-varying", add_all_images_to_prompt=True)
    for prompt in (f"a{portrait}b{landscape}c", f"{landscape}{portrait}"):
        result = embedder.forward(prompt, state())
        ids = result.input_ids
        assert embedder.len_in_tokens(prompt) == ids.shape[0]
    assert (ids == token("<image>")).sum() == 4 + 8


def test_len_in_tokens_decodes_no_pixels(llama):
    full_jpeg = encoded(noise_image(7, (32, 48)))
    truncated_jpeg = full_jpeg[:full_jpeg.index(b"\xff\xda") + 20]  # the header is intact, the pixels are cut
    embedder = make("fake-varying", add_all_images_to_prompt=True)
    assert embedder.len_in_tokens(f"a{tag_of_bytes(truncated_jpeg)}") == len(ids_of("a<im_start>", True)) + 8 + 1
    assert make().len_in_tokens(f"a{tag_of_bytes(b'not an image at all')}") == len(ids_of("a<im_start>", True)) + 4 + 1


def test_over_long_text_before_an_image_keeps_the_start_marker(llama):
    long_text = "The quick brown fox jumps over the lazy dog. " * 6
    tail = ids_of("<im_end> What is it?")
    embedder = make()
    max_length = 4 + len(tail) + 3
    notices = state(truncation_length=max_length + 16)
    result = embedder.forward(f"{long_text}{IMG[0]} What is it?", notices)
    ids = result.input_ids
    n_images = result.images
    assert ids.shape[0] == max_length and n_images == 1
    full_head = ids_of(long_text + "<im_start>", bos=True)
    assert ids[:3].tolist() == full_head[-3:]
    assert ids[2] == token("<im_start>") and ids[3:7].tolist() == [token("<image>")] * 4
    assert "notices" not in notices


def test_start_marker_that_does_not_fit_goes_with_its_image(llama):
    embedder = make()
    tail = ids_of("<im_end> end")
    result = embedder.forward(f"text{IMG[0]} end", state())
    full_ids = result.input_ids
    # room for the image and the text after it, but not for the <im_start> before it
    fits_exactly = state(truncation_length=4 + len(tail) + 1 + 16)
    result = embedder.forward(f"text{IMG[0]} end", fits_exactly)
    ids = result.input_ids
    assert ids[0] == token("<im_start>") and ids.shape[0] == 4 + len(tail) + 1
    too_small = state(truncation_length=4 + len(tail) + 16)
    result = embedder.forward(f"text{IMG[0]} end", too_small)
    ids = result.input_ids
    n_images = result.images
    assert ids.tolist() == tail and n_images == 0
    assert too_small["notices"] and "Removed 1 image(s)" in too_small["notices"][0]


def test_an_image_at_the_cut_is_removed_whole(llama):
    embedder = make(add_all_images_to_prompt=True)
    prompt = f"a{IMG[0]}b{IMG[1]}c{IMG[2]} last"
    result = embedder.forward(prompt, state())
    full = result.input_ids
    last_image_start = len(full) - len(ids_of("<im_end> last")) - 4
    # the cut falls inside the middle image (keep its last two rows and what follows)
    middle_image_end = last_image_start - len(ids_of("<im_end>c<im_start>"))
    cut = state(truncation_length=len(full) - middle_image_end + 2 + 16)
    result = embedder.forward(prompt, cut)
    ids = result.input_ids
    embeds = result.inputs_embeds
    n_images = result.images
    assert n_images == 1 and ids.shape[0] <= len(full) - middle_image_end + 2
    assert ids.tolist() == full[middle_image_end:].tolist()
    assert cut["notices"] == [cut["notices"][0]] and "Removed 2 image(s)" in cut["notices"][0]
    assert result.stats.removed_images == 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.one_of(st.sampled_from(range(4)), st.text("abc xyz.,!?\n", max_size=30)), max_size=8),
       max_length=st.integers(1, 120), add_all=st.booleans(), markers=st.booleans())
def test_truncation_never_cuts_an_image(llama, pieces, max_length, add_all, markers):
    prompt = "".join(IMG[p] if isinstance(p, int) else p for p in pieces)
    embedder = make("fake-linear" if markers else "fake-no-markers", add_all_images_to_prompt=add_all)
    try:
        result = embedder.forward(prompt, state(truncation_length=max_length + 16))
        ids = result.input_ids
        embeds = result.inputs_embeds
        n_images = result.images
    except ValueError as error:  # only when nothing at all fits
        assert "cannot fit" in str(error)
        return
    assert ids.shape[0] == embeds.shape[0] <= max_length
    runs, current = [], 0
    for is_placeholder in (ids == token("<image>")).tolist() + [False]:
        if is_placeholder:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if markers:
        assert all(run == 4 for run in runs), runs
    else:  # adjacent images without markers make one run of whole images
        assert all(run % 4 == 0 for run in runs), runs
    assert sum(runs) == 4 * n_images


# -- Stitching ------------------------------------------------------------------------------------

def test_stitched_rows_equal_the_pipeline_embeddings_in_prompt_order(llama):
    embedder = make("fake-img-markers", add_all_images_to_prompt=True)
    pipeline = embedder.pipeline
    tags = [tag(noise_image(10)), tag(solid_image((0, 200, 0)))]
    result = embedder.forward(f"Look:{tags[0]} and {tags[1]}?", state())
    ids = result.input_ids
    embeds = result.inputs_embeds
    expected = []
    for text, bos, image_tag in (("Look:<Img>", True, tags[0]), ("</Img> and <Img>", False, tags[1])):
        expected.append(pipeline.embed_tokens(encode(text, add_special_tokens=bos, add_bos_token=bos)[0]))
        decoded = tag_b64_to_image(IMAGE_TAG_RE.fullmatch(image_tag).group("data"))
        expected.append(pipeline.embed_images([decoded])[0])
    expected.append(pipeline.embed_tokens(encode("</Img>?", add_special_tokens=False)[0]))
    assert torch.equal(embeds, torch.cat(expected))
    # and the image rows really depend on the pixels
    assert not torch.equal(expected[1], expected[3])


def test_older_images_get_placeholder_embeddings(llama):
    embedder = make()
    result = embedder.forward(f"a{IMG[0]}b{IMG[1]}c", state())
    ids = result.input_ids
    embeds = result.inputs_embeds
    first = ids_of("a<im_start>", True)
    placeholder = embedder.pipeline.placeholder_embeddings()
    assert torch.equal(embeds[len(first):len(first) + 4], placeholder)
    assert embedder.pipeline.batches == [1], "only the last image is embedded"


def test_a_wrong_row_count_raises_a_clear_error(llama):
    embedder = make("fake-wrong-rows")
    with pytest.raises(EmbeddingCountError) as error:
        embedder.forward(f"a{IMG[0]}b", state())
    message = str(error.value)
    assert "fake-wrong-rows" in message and "3 embedding rows" in message and "4 placeholder tokens" in message


def test_short_placeholder_embeddings_make_the_ids_follow_with_one_warning(llama, caplog):
    embedder = make("fake-short-placeholder")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            result = embedder.forward(f"a{IMG[0]}b{IMG[1]}c{IMG[2]}", state())
            ids = result.input_ids
            embeds = result.inputs_embeds
    assert ids.shape[0] == embeds.shape[0]
    assert (ids == token("<image>")).sum() == 2 + 2 + 4
    assert sum("placeholder embedding rows" in r.message for r in caplog.records) == 1


# -- Caches ---------------------------------------------------------------------------------------

def test_cache_hit_and_miss(llama, caplog):
    embedder = make()
    first = embedder.forward(f"a{IMG[0]}", state())
    assert (first.stats.images, first.stats.from_cache) == (1, 0)
    second = embedder.forward(f"other text {IMG[0]}", state())
    assert (second.stats.images, second.stats.from_cache) == (1, 1)
    assert embedder.pipeline.batches == [1]
    assert torch.equal(first.inputs_embeds[-5:], second.inputs_embeds[-5:])
    embedder.forward(f"a{IMG[1]}", state())
    assert embedder.pipeline.batches == [1, 1]


def test_same_size_different_pixels_never_share_an_entry(llama):
    embedder = make(add_all_images_to_prompt=True)
    red, blue = tag(solid_image((255, 0, 0))), tag(solid_image((0, 0, 255)))
    result = embedder.forward(f"{red}{blue}", state(add_bos_token=False))
    ids = result.input_ids
    embeds = result.inputs_embeds
    assert embedder.pipeline.batches == [2], "both misses in one batch"
    marker = 1 + int(ids[0] == shared.tokenizer.bos_token_id)  # after <im_start> (and the tokenizer's own BOS)
    assert not torch.equal(embeds[marker:marker + 4], embeds[-5:-1])
    result = embedder.forward(f"{blue}{red}", state(add_bos_token=False))
    again = result.inputs_embeds
    assert embedder.pipeline.batches == [2] and result.stats.from_cache == 2
    assert torch.equal(again[marker:marker + 4], embeds[-5:-1])


def test_the_same_image_twice_is_embedded_once(llama):
    embedder = make(add_all_images_to_prompt=True)
    result = embedder.forward(f"{IMG[0]}{IMG[0]}", state(add_bos_token=False))
    ids = result.input_ids
    embeds = result.inputs_embeds
    assert embedder.pipeline.batches == [1]
    marker = 1 + int(ids[0] == shared.tokenizer.bos_token_id)
    assert torch.equal(embeds[marker:marker + 4], embeds[-5:-1])


def test_cached_output_equals_uncached_output(llama):
    prompt = f"a{IMG[0]}b{IMG[1]}c"
    cached = make(add_all_images_to_prompt=True)
    cached.forward(prompt, state())
    from_cache = cached.forward(prompt, state())
    assert from_cache.stats.from_cache == 2
    uncached = make(add_all_images_to_prompt=True, embedding_cache_mb=0)
    plain = uncached.forward(prompt, state())
    uncached.forward(prompt, state())
    assert uncached.pipeline.batches == [2, 2] and len(uncached.images.cache) == 0
    assert torch.equal(from_cache.input_ids, plain.input_ids) and torch.equal(from_cache.inputs_embeds, plain.inputs_embeds)


def test_settings_that_change_embeddings_are_part_of_the_key(llama):
    embedder = make()
    embedder.forward(f"a{IMG[0]}", state())
    embedder.params["vision_bits"] = 16  # the settings change the params in place
    embedder.forward(f"a{IMG[0]}", state())
    assert embedder.pipeline.batches == [1, 1]


def test_placeholder_images_are_neither_embedded_nor_decoded(llama):
    embedder = make()
    broken = tag_of_bytes(b"this is not an image")
    result = embedder.forward(f"old {broken} new {IMG[0]}", state())
    ids = result.input_ids
    n_images = result.images
    assert n_images == 2 and embedder.pipeline.batches == [1]


def phone_sized_tag(seed: int) -> str:
    """A picture whose tag, like a phone photo's, holds more than half the prompt memo's bound (PNG noise)."""
    big = tag(noise_image(seed, (1100, 1100)), "PNG")
    assert len(big) > prompt_encoding.MEMO_BYTES // 2
    return big


def counted(monkeypatch, function, name: str) -> list:
    """Calls of `name`, as `function`'s module looks it up (tests reload extension modules)."""
    calls, real = [], function.__globals__[name]

    def wrapper(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setitem(function.__globals__, name, wrapper)
    return calls


def test_large_pictures_are_laid_out_and_decoded_once_per_chat(llama, monkeypatch):
    """Three phone-sized tags (more than the prompt memo holds as text) are laid out once, not at every
    measure, and a picture whose embedding is cached is not decoded again to find its key."""
    embedder = make("fake-varying", add_all_images_to_prompt=True)
    prompt = "".join(f"turn {i} {phone_sized_tag(i)}" for i in range(3)) + " last question"
    read_headers = counted(monkeypatch, type(embedder.prompts).image_layout, "image_for_counting")
    decoded = counted(monkeypatch, type(embedder.images).embed_misses, "b64_to_bytes")
    first = embedder.forward(prompt, state(truncation_length=4096))
    assert (len(read_headers), len(decoded), first.stats.from_cache) == (3, 3, 0)
    for _ in range(2):  # the next turns measure and embed the same pictures
        assert embedder.len_in_tokens(prompt) == first.input_ids.shape[0]
        again = embedder.forward(prompt, state(truncation_length=4096))
    assert (len(read_headers), len(decoded), again.stats.from_cache) == (3, 3, 3)
    assert torch.equal(again.inputs_embeds, first.inputs_embeds)
    assert embedder.prompts.memo.total_bytes < 1024 * 1024, "the memo holds ids, not the pictures' text"


def test_a_prompt_measured_then_encoded_is_split_and_hashed_once(llama, monkeypatch):
    """A chat turn measures its prompt, then encodes the same string: its tags are found and hashed once
    (counted at `split_prompt` and at SHA-256), each call still gets parts of its own to lay out, and
    another string, even with the same text, is split anew, its pictures known by their data (the next
    turn's prompt holds them again)."""
    embedder = make("fake-varying", add_all_images_to_prompt=True)
    monkeypatch.setattr(image_codec, "_checked_data", BoundedLRU(2**30))  # no picture seen before
    prompt = "".join(f"turn {i} {phone_sized_tag(i)}" for i in range(2)) + " last question"
    splits = counted(monkeypatch, type(embedder.prompts).split, "split_prompt")
    hashed, sha256 = [], hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or sha256(data))
    length = embedder.len_in_tokens(prompt)
    assert embedder.forward(prompt, state(truncation_length=4096)).input_ids.shape[0] == length
    assert len(splits) == 1
    assert sum(size > prompt_encoding.MEMO_BYTES // 2 for size in hashed) == 2, "each picture hashed once"
    first, second = embedder.prompts.split(prompt), embedder.prompts.split(prompt)
    assert [p.text for p in first] == [p.text for p in second] and first[1] is not second[1]
    first[1].input_ids = torch.tensor([1])
    assert second[1].input_ids is None
    assert embedder.len_in_tokens("".join([prompt[:10], prompt[10:]])) == length
    assert len(splits) == 2
    assert sum(size > prompt_encoding.MEMO_BYTES // 2 for size in hashed) == 2, "not hashed again"


def test_text_memo_returns_what_encode_returns(llama, monkeypatch):
    """The first part is the host's encode of a prompt; later parts carry no special tokens at all; a
    text seen before is not encoded again (counted at the encoder's own `encode`)."""
    embedder = make()
    encoded_texts = []

    def counted_encode(text, *args, **kwargs):
        encoded_texts.append(text)
        return encode(text, *args, **kwargs)

    # the globals of the module the embedder's encoder comes from (tests reload extension modules)
    monkeypatch.setitem(type(embedder.prompts).text_ids.__globals__, "encode", counted_encode)
    bos = shared.tokenizer.bos_token_id
    for text in ["", "Hello world", "<im_end>USER: What is it?\nASSISTANT:", "Hello world", "ünïcödé 123"]:
        for add_bos in (True, False):
            assert torch.equal(embedder.prompts.text_ids(text, first=True, add_bos=add_bos),
                               encode(text, add_bos_token=add_bos)[0])
        later = embedder.prompts.text_ids(text, first=False)
        assert torch.equal(later, encode(text, add_special_tokens=False, add_bos_token=False)[0])
        assert bos not in later.tolist()
    # "Hello world" came twice: encoded for each BOS rule and once after a special token, the first time only
    assert encoded_texts.count("Hello world") == 2
    assert sum(text.endswith("Hello world") and text != "Hello world" for text in encoded_texts) == 1


def test_bounded_lru_evicts_the_least_recently_used_by_bytes():
    cache = BoundedLRU(max_bytes=10)
    cache.put("a", 1, 4)
    cache.put("b", 2, 4)
    assert cache.get("a") == 1  # "b" is now the oldest
    cache.put("c", 3, 4)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3 and cache.total_bytes == 8
    cache.put("huge", 4, 11)
    assert cache.get("huge") is None
    disabled = BoundedLRU(max_bytes=0)
    disabled.put("a", 1, 1)
    assert len(disabled) == 0
    assert cache.take("a") == 1 and cache.get("a") is None and cache.total_bytes == 4 and cache.take("a") is None
