"""Hostile image input: every bad image is an ImageDecodeError naming which image and why; odd but valid
images decode; oversized images are rejected before decoding; limits raise clear ValueErrors; fuzzing
the decoder and the splitter yields only the project's own errors."""
from __future__ import annotations

import base64
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from extensions.multimodal.core.image_codec import (ImageDecodeError, b64_to_bytes, decode_image_bytes, image_for_counting,
                                               image_label, tag_b64_to_image)
from extensions.multimodal.core.multimodal_embedder import MultimodalEmbedder, PromptTooLongError, TooManyImagesError
from extensions.multimodal.core.prompt_parts import split_prompt
from modules import shared
from modules.text_generation import generate_reply
from fixtures.bad_pictures import png_header_only
from tests.conftest import ROOT
from tests.multimodal_fake_pipeline import encoded, make_embedder, noise_image, solid_image, tag, tag_of_bytes

GOOD = tag(noise_image(0))


def make(name: str = "fake-linear", **overrides) -> MultimodalEmbedder:
    return make_embedder(name, **{"add_all_images_to_prompt": True, "embedding_cache_mb": 16, **overrides})


def state(**overrides) -> dict:
    return {"add_bos_token": True, "truncation_length": 1024, "max_new_tokens": 16, **overrides}


def forward(prompt: str, embedder: MultimodalEmbedder | None = None, **state_overrides):
    embedder = embedder or make()
    return embedder.forward(prompt, state(**state_overrides))


def animated_gif() -> bytes:
    frames = [solid_image((255, 0, 0)), solid_image((0, 0, 255))]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 8
    return encoded(noise_image(3, (40, 20)), "JPEG", exif=exif.tobytes())


def palette_with_transparency() -> bytes:
    image = Image.new("P", (16, 16), 0)
    image.putpalette([0, 0, 0] * 256)
    return encoded(image, "PNG", transparency=0)


def truncated_jpeg() -> bytes:
    data = encoded(noise_image(4, (64, 64)))
    return data[:len(data) // 2]


# -- Bad images: which one and why ----------------------------------------------------------------

@pytest.mark.parametrize("bad_tag,why", [
    ('<img src="data:image/jpeg;base64,AAAAA">', "base64"),  # bad length
    ('<img src="data:image/jpeg;base64,AB=CDEFG">', "base64"),  # padding in the middle
    ('<img src="data:image/jpeg;base64,====">', "base64|no bytes"),  # decodes to nothing
    (tag_of_bytes(b"hello, I am not an image"), "not an image format"),
    (tag_of_bytes(truncated_jpeg()), "truncated or corrupt"),
])
def test_a_bad_image_names_itself_and_the_cause(llama, bad_tag, why):
    with pytest.raises(ImageDecodeError, match=why) as error:
        forward(f"first {GOOD} second {bad_tag} end")
    assert "the 2nd image" in str(error.value)
    assert isinstance(error.value, ValueError)


def test_bad_base64_characters_and_zero_bytes():
    with pytest.raises(ImageDecodeError, match="base64"):
        b64_to_bytes("ab$d")
    with pytest.raises(ImageDecodeError, match="0-byte"):
        decode_image_bytes(b"")


@pytest.mark.parametrize("make_bytes", [
    lambda: encoded(solid_image((0, 0, 255)), "PNG"),
    lambda: encoded(solid_image((0, 0, 255)), "WEBP"),
    lambda: encoded(solid_image((0, 0, 255)), "GIF"),
    animated_gif,
    lambda: encoded(Image.new("RGB", (1, 1), (9, 9, 9)), "PNG"),
    lambda: encoded(noise_image(2, (10000, 10)), "PNG"),
    lambda: encoded(solid_image((0, 255, 255, 0), mode="CMYK"), "JPEG"),
    palette_with_transparency,
    lambda: encoded(solid_image((0, 128), mode="LA"), "PNG"),
    lambda: encoded(Image.new("I;16", (8, 8), 40000), "PNG"),
    exif_rotated,
], ids=["png", "webp", "gif", "animated-gif", "1x1", "10000x10", "cmyk", "p-transparent", "la", "i16", "exif"])
def test_odd_but_valid_images_go_through(llama, make_bytes):
    result = forward(f"look {tag_of_bytes(make_bytes())} now")
    assert result.images == 1 and result.input_ids.shape[0] == result.inputs_embeds.shape[0]
    assert torch.isfinite(result.inputs_embeds).all()


def test_animated_gif_gives_its_first_frame():
    assert decode_image_bytes(animated_gif()).getpixel((4, 4))[0] > 200


def test_exif_rotation_is_counted_for_per_image_token_counts():
    b64 = base64.b64encode(exif_rotated()).decode()
    assert image_for_counting(b64).size == tag_b64_to_image(b64).size == (20, 40)


# -- Decompression bombs ------------------------------------------------------------------------

def test_too_many_pixels_is_rejected_before_decoding(llama):
    bomb = png_header_only(8000, 6000)  # 48 megapixels in a few dozen bytes
    started = time.perf_counter()
    with pytest.raises(ImageDecodeError, match="8000x6000") as error:
        forward(f"a {tag_of_bytes(bomb)}")
    assert "limit of 40,000,000" in str(error.value) and "1st image" in str(error.value)
    assert time.perf_counter() - started < 2
    with pytest.raises(ImageDecodeError, match="more than the limit"):
        forward(f"a {tag(noise_image(1, (40, 40)))}", make(max_image_pixels=1000))


def test_pillows_own_bomb_guard_stays_on():
    assert Image.MAX_IMAGE_PIXELS is not None
    with pytest.raises(ImageDecodeError, match="decompression bomb"):
        decode_image_bytes(png_header_only(100_000, 100_000), max_pixels=10**12)


# -- Limits -------------------------------------------------------------------------------------

def test_more_images_than_the_pipeline_allows(llama):
    with pytest.raises(TooManyImagesError, match="fake-one-image' allows at most 1") as error:
        forward(f"{GOOD} and {tag(noise_image(9))}", make("fake-one-image"))
    assert "2 images" in str(error.value) and isinstance(error.value, ValueError)
    result = forward(f"{GOOD} and {tag(noise_image(9))}", make("fake-one-image", add_all_images_to_prompt=False))
    assert result.images == 2, "older images as placeholders do not count"


def test_more_images_than_the_setting_allows(llama):
    with pytest.raises(TooManyImagesError, match="max_images_per_prompt setting allows at most 2"):
        forward(GOOD * 3, make(max_images_per_prompt=2))


def test_a_prompt_that_cannot_fit_is_a_clear_error(llama):
    with pytest.raises(PromptTooLongError, match="Lower max_new_tokens"):
        forward(f"a {GOOD}", truncation_length=16, max_new_tokens=16)
    with pytest.raises(PromptTooLongError, match="cannot fit"):
        forward(GOOD, make("fake-no-markers"), add_bos_token=False, truncation_length=16 + 3)


def test_a_pipeline_failure_propagates_and_releases_the_lock(host, llama_dir):
    host.load(llama_dir, ["multimodal"], argv=["--multimodal-pipeline", "fake-failing"],
              settings={"multimodal-pipeline_dirs": [str(ROOT / "tests" / "multimodal_pipelines")]})
    with pytest.raises(RuntimeError, match="out of memory"):
        list(generate_reply(f"look {GOOD}", host.greedy_state()))
    assert not shared.generation_lock.locked()


# -- Fuzzing ------------------------------------------------------------------------------------

SEEDS = [encoded(noise_image(1, (8, 8)), fmt) for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP")]


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=300),
                      st.tuples(st.sampled_from(SEEDS), st.integers(0, 400), st.binary(min_size=1, max_size=8))
                      .map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + len(t[2]):])))
def test_fuzz_decoder_raises_only_image_decode_errors(data):
    try:
        image = decode_image_bytes(data, max_pixels=1_000_000)
    except ImageDecodeError:
        return
    assert image.mode == "RGB" and image.size[0] * image.size[1] <= 1_000_000


FRAGMENTS = ['<img src="data:image/jpeg;base64,', '">', "<img", "base64,", "QUJD", "AAAA", "====", "/+", "<",
             ">", '"', "text ", "\n", GOOD, tag_of_bytes(b"junk")]


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=12))
def test_fuzz_splitter_and_tag_decoder(llama, pieces):
    prompt = "".join(pieces)
    parts = split_prompt(prompt, None, None)
    assert "".join(part.text for part in parts) == prompt
    assert [part.is_image for part in parts] == [i % 2 == 1 for i in range(len(parts))]
    try:
        for part in make().prompts.split(prompt):
            if part.is_image:
                tag_b64_to_image(part.b64, label=image_label(part.index))
    except ImageDecodeError as error:
        assert "image in the prompt" in str(error)
