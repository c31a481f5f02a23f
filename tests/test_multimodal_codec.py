"""The image codec: real JPEG tags, normalisation (alpha, palette, CMYK, EXIF), any format behind the tag."""
from __future__ import annotations

import base64
import hashlib
from io import BytesIO

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from extensions.multimodal.core import image_codec
from extensions.multimodal.core.image_codec import (IMAGE_TAG_RE, cap_size, decode_image_bytes, find_tags, has_tag,
                                               ordinal, store_bytes, store_image, tag_b64_to_image)
from tests.multimodal_fake_pipeline import encoded, noise_image, solid_image, tag


def tag_bytes(tag_text: str) -> bytes:
    match = IMAGE_TAG_RE.fullmatch(tag_text)
    assert match is not None, tag_text[:80]
    return base64.b64decode(match.group("data"))


def test_tags_have_the_exact_form_and_the_label_matches_the_bytes():
    jpeg, png = store_bytes(encoded(noise_image(0), "JPEG")).tag, store_image(noise_image(0)).tag
    assert jpeg.startswith('<img src="data:image/jpeg;base64,') and jpeg.endswith('">')
    assert tag_bytes(jpeg)[:3] == b"\xff\xd8\xff", "JPEG magic bytes under the jpeg label"
    assert png.startswith('<img src="data:image/png;base64,') and tag_bytes(png)[:8] == b"\x89PNG\r\n\x1a\n"


# Pieces of tags and near-tags: find_tags must find exactly what the regular expression finds.
TAG_PIECES = st.sampled_from(['<img src="data:', '<img src="data:image/', "image/jpeg", "image/png", "image/gif",
                              ";base64,", '">', '"', ">", "<", "A", "z", "9", "+", "/", "=", "==", " ", "\n", "é",
                              "-", "_", "<img", '<img src="data:image/jpeg;base64,', '<img src="data:image/png;base64,',
                              '<img src="data:image/jpeg;base64,QUJD">'])


def regex_tags(text: str) -> list:
    return [(m.start(), m.end(), m.group("mime"), m.group("data")) for m in IMAGE_TAG_RE.finditer(text)]


@settings(max_examples=400, deadline=None)
@given(st.lists(TAG_PIECES, max_size=40).map("".join))
def test_find_tags_finds_what_the_tag_pattern_matches(text):
    assert [found(tag) for tag in find_tags(text)] == regex_tags(text)
    assert has_tag(text) == (IMAGE_TAG_RE.search(text) is not None)


def found(tag) -> tuple:
    """A tag as `regex_tags` gives it, after checking its digest."""
    assert tag.digest == hashlib.sha256(tag.data.encode("ascii")).digest()
    return tag.start, tag.end, tag.mime, tag.data


def test_find_tags_on_a_chat_with_real_tags_and_broken_ones():
    real = [store_bytes(encoded(noise_image(seed), fmt)).tag for seed, fmt in ((1, "JPEG"), (2, "PNG"))]
    broken = ['<img src="data:image/jpeg;base64,">', '<img src="data:image/jpeg;base64,QUJD>',
              '<img src="data:image/jpeg;base64,QU JD">', '<img src="data:image/webp;base64,QUJD">',
              '<img src="data:image/png;base64,QUJD"', '<img src="data:image/png;base64,QUJDé">']
    text = (f"USER: {real[0]}{broken[0]} what?\n" + "".join(broken[1:]) +
            f'\nUSER: <img src="data:image/{real[1]} and{broken[-1]}')  # a tag right after a broken head
    tags = list(find_tags(text))
    assert [text[tag.start:tag.end] for tag in tags] == real
    assert [found(tag) for tag in tags] == regex_tags(text)



def jpeg_tag(data: str) -> str:
    return image_codec.TAG_TEMPLATE.format(mime="image/jpeg", data=data)


def test_data_read_again_is_not_checked_again_and_only_equal_data_is_taken_for_it(monkeypatch):
    monkeypatch.setattr(image_codec, "_checked_data", image_codec.BoundedLRU(2**20))
    data = base64.b64encode(bytes(range(256)) * 40).decode("ascii")
    first = next(find_tags(f"USER: {jpeg_tag(data)} What is it?"))
    again = next(find_tags(f"USER: hi\nASSISTANT: hello\nUSER: {jpeg_tag(data)}"))
    assert again.data is first.data and again.digest is first.digest, "the string checked before, not a new slice"
    wide = next(find_tags(f"USER: été 🙂 {jpeg_tag(data)}"))  # a text stored four bytes a character
    assert wide.data is first.data and wide.start == len("USER: été 🙂 ")
    # The same length and the same last characters (the memo's key), other data: its own, or none.
    other = "B" + data[1:]
    assert found(next(find_tags(jpeg_tag(other))))[3] == other
    assert not has_tag(jpeg_tag("-" + data[1:])) and not has_tag(jpeg_tag("é" + data[1:]))
    assert next(find_tags(jpeg_tag(data))).data == data


def test_the_jpeg_history_format_round_trip_keeps_the_pixels_close():
    image = Image.fromarray(np.tile(np.linspace(0, 255, 48, dtype=np.uint8), (32, 1))[..., None].repeat(3, 2), "RGB")
    stored = store_image(image, "jpeg")
    assert stored.changed and stored.mime == "image/jpeg"
    back = tag_b64_to_image(IMAGE_TAG_RE.fullmatch(stored.tag).group("data"))
    assert back.mode == "RGB" and back.size == image.size
    difference = np.abs(np.asarray(back, dtype=int) - np.asarray(image, dtype=int))
    assert difference.mean() < 3


@pytest.mark.parametrize("mode,color", [("RGBA", (0, 0, 255, 0)), ("LA", (0, 0))])
def test_transparent_pixels_go_onto_white(mode, color):
    image = decode_image_bytes(encoded(solid_image(color, mode=mode), "PNG"))
    assert image.mode == "RGB" and image.getpixel((5, 5)) == (255, 255, 255)


def test_half_transparent_pixels_blend_with_white():
    image = decode_image_bytes(encoded(solid_image((0, 0, 0, 128), mode="RGBA"), "PNG"))
    assert all(abs(channel - 127) <= 1 for channel in image.getpixel((0, 0)))


def test_palette_image_with_transparency():
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 255, 0] + [255, 0, 0] * 255)
    palette.putpixel((0, 0), 0)
    image = decode_image_bytes(encoded(palette, "PNG", transparency=0))
    assert image.getpixel((0, 0)) == (255, 255, 255), "the transparent index is white, not green"
    assert image.getpixel((4, 4)) == (255, 0, 0)


def test_cmyk_jpeg_decodes_to_rgb():
    image = decode_image_bytes(encoded(solid_image((0, 255, 255, 0), mode="CMYK"), "JPEG"))
    red, green, blue = image.getpixel((4, 4))
    assert image.mode == "RGB" and red > 200 and green < 60 and blue < 60


def test_exif_orientation_is_applied():
    source = Image.new("RGB", (40, 20), (255, 0, 0))
    source.paste((0, 0, 255), (0, 0, 20, 20))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    image = decode_image_bytes(encoded(source, "JPEG", exif=exif.tobytes()))
    assert image.size == (20, 40)
    assert image.getpixel((10, 5))[2] > 200, "the blue half is on top after rotation"


def test_png_webp_and_gif_behind_the_jpeg_label_decode():
    for fmt in ("PNG", "WEBP", "GIF", "BMP"):
        text = tag(solid_image((0, 0, 255)), fmt)
        image = tag_b64_to_image(IMAGE_TAG_RE.fullmatch(text).group("data"))
        assert image.mode == "RGB" and image.getpixel((3, 3))[2] > 200, fmt


def test_the_jpeg_history_format_re_encodes_and_caps_the_size_without_upscaling():
    big = store_bytes(encoded(noise_image(1, (200, 100)), "PNG"), history_format="jpeg", max_side=64)
    assert big.changed and Image.open(BytesIO(big.data)).size == (64, 32)
    small = store_bytes(encoded(noise_image(1, (20, 10)), "PNG"), history_format="jpeg", max_side=64)
    assert Image.open(BytesIO(small.data)).size == (20, 10) and Image.open(BytesIO(small.data)).format == "JPEG"
    sent = encoded(noise_image(1, (20, 10)), "JPEG")
    assert store_bytes(sent, history_format="jpeg", max_side=64) == store_bytes(sent), "a small JPEG stays as sent"
    with pytest.raises(ValueError, match="history_image_format='webp'"):
        store_bytes(sent, history_format="webp")


def test_cap_size_keeps_thin_images_at_least_one_pixel():
    assert cap_size(Image.new("RGB", (10000, 10)), 64).size == (64, 1)


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_sixteen_bit_grey_is_scaled_not_clipped():
    grey = Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16))
    assert grey.mode == "I;16"
    image = decode_image_bytes(encoded(grey, "PNG"))
    assert abs(image.getpixel((0, 0))[0] - 128) <= 1



def test_another_reader_is_sent_the_pixels_read_here():
    """A remote engine (vLLM) reads a picture's bytes with Pillow's plain `convert("RGB")`: the same
    pixels as here for every picture but a 16-bit greyscale PNG, which goes as the 8-bit pixels read here."""
    def plainly_read(url: str) -> np.ndarray:
        return np.asarray(Image.open(BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))

    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (8, 1))
    pictures = {"16-bit grey": Image.fromarray(ramp), "8-bit grey": Image.fromarray((ramp >> 8).astype(np.uint8)),
                "RGB": noise_image(3), "grey and alpha": solid_image((90, 255), mode="LA")}
    for name, picture in pictures.items():
        tag_text = store_bytes(encoded(picture, "PNG")).tag
        tag = next(find_tags(tag_text))
        url = image_codec.as_read_data_url(tag)
        assert np.array_equal(plainly_read(url), np.asarray(tag_b64_to_image(tag.data))), name
        assert (url == f"data:image/png;base64,{tag.data}") == (name != "16-bit grey"), name
    jpeg = next(find_tags(store_bytes(encoded(noise_image(4), "JPEG")).tag))
    assert image_codec.as_read_data_url(jpeg) == f"data:image/jpeg;base64,{jpeg.data}"


def test_regex_reads_the_technical_description_s_tag_and_png():
    """The technical description's exact tag, and `image/png` for lossless pictures; nothing looser."""
    for mime in ("image/jpeg", "image/png"):
        match = image_codec.IMAGE_TAG_RE.fullmatch(f'<img src="data:{mime};base64,QUJD+/==">')
        assert match and (match.group("mime"), match.group("data")) == (mime, "QUJD+/==")
    for near_miss in ('<img src="data:image/gif;base64,QUJD">', '<img src="data:image/jpeg;base64,QU"JD">',
                      "<img src='data:image/jpeg;base64,QUJD'>", '<img src="data:image/jpeg;base64,">'):
        assert image_codec.IMAGE_TAG_RE.search(near_miss) is None, near_miss


DECODE = image_codec.decode_opened  # before a test counts its calls


def fresh_decode(data: bytes) -> np.ndarray:
    """The bytes decoded from scratch, past the pixels `store_bytes` keeps."""
    return np.asarray(DECODE(image_codec.open_image(data)))


def counted_decodes(monkeypatch) -> list:
    """Calls of the codec's decode from here on, with no picture known as stored before (an earlier test's)."""
    calls = []
    monkeypatch.setattr(image_codec, "_kept_as_sent", image_codec.BoundedLRU(2**20))
    monkeypatch.setattr(image_codec, "decode_opened", lambda *a, **k: calls.append(1) or DECODE(*a, **k))
    return calls


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to view
    return encoded(noise_image(5, (40, 24)), "JPEG", exif=exif)


STORED_FORMS = {"jpeg": lambda: encoded(noise_image(1), "JPEG"), "png": lambda: encoded(noise_image(2), "PNG"),
                "rgba png": lambda: encoded(solid_image((0, 0, 255, 90), mode="RGBA"), "PNG"),
                "webp (stored as png)": lambda: encoded(noise_image(3), "WEBP", lossless=True),
                "gif (stored as png)": lambda: encoded(noise_image(4).convert("P"), "GIF"),
                "exif-rotated jpeg": rotated_jpeg}


@pytest.mark.parametrize("form", STORED_FORMS)
def test_a_stored_picture_is_decoded_once_for_its_first_read(form, monkeypatch):
    """The pixels decoded to store a picture serve the first read of its tag: what decoding the stored
    bytes gives; later reads decode again, and a change to one read's picture reaches no other."""
    decodes = counted_decodes(monkeypatch)
    stored = store_bytes(STORED_FORMS[form]())
    data = IMAGE_TAG_RE.fullmatch(stored.tag).group("data")
    first = tag_b64_to_image(data)
    assert len(decodes) == 1, "the first read took the pixels decoded when it was stored"
    assert np.array_equal(np.asarray(first), fresh_decode(stored.data))
    first.paste((0, 0, 0), (0, 0, first.width, first.height))
    second = tag_b64_to_image(data)
    assert len(decodes) == 2 and np.array_equal(np.asarray(second), fresh_decode(stored.data))


def test_a_re_encoded_picture_is_read_from_its_stored_bytes(monkeypatch):
    """The `jpeg` history format changes the pixels: the model sees those of the JPEG the history keeps."""
    decodes = counted_decodes(monkeypatch)
    stored = store_bytes(encoded(noise_image(6), "PNG"), history_format="jpeg")
    read = tag_b64_to_image(IMAGE_TAG_RE.fullmatch(stored.tag).group("data"))
    assert stored.changed and len(decodes) == 2  # stored, then its JPEG, read from scratch
    assert np.array_equal(np.asarray(read), fresh_decode(stored.data))


def test_a_kept_picture_over_a_lower_pixel_limit_is_still_refused():
    data = encoded(noise_image(7, (64, 64)), "PNG")
    store_bytes(data)
    with pytest.raises(image_codec.ImageDecodeError, match="more than the limit of 1,000"):
        decode_image_bytes(data, max_pixels=1000)


def test_pictures_never_read_are_kept_within_a_bound(monkeypatch):
    pictures = [encoded(noise_image(seed), "PNG") for seed in range(10)]
    monkeypatch.setattr(image_codec, "_stored_pixels", image_codec.BoundedLRU(3 * (32 * 32 * 3 + max(map(len, pictures)))))
    for data in pictures:
        store_bytes(data)
    assert len(image_codec._stored_pixels) == 3


def test_a_picture_sent_again_is_not_decoded_again_under_the_same_limits(monkeypatch):
    """An OpenAI-style client sends every picture of the conversation again with each request."""
    decodes = counted_decodes(monkeypatch)
    data = encoded(noise_image(11, (48, 40)), "JPEG")
    first = store_bytes(data)
    assert store_bytes(bytes(data)) == first and len(decodes) == 1, "the same bytes again: not decoded again"
    assert store_bytes(data, max_pixels=10**6) == first and len(decodes) == 2, "another limit: checked again"
    with pytest.raises(image_codec.ImageDecodeError, match="more than the limit of 1,000"):
        store_bytes(data, max_pixels=1000)
    converted = encoded(noise_image(12), "WEBP", lossless=True)
    assert store_bytes(converted) == store_bytes(converted) and len(decodes) == 4, "a picture stored changed: each time"


def test_a_broken_picture_sent_again_is_refused_again(monkeypatch):
    decodes = counted_decodes(monkeypatch)
    whole = encoded(noise_image(13, (64, 64)), "PNG")
    broken = whole[:len(whole) // 2]  # the header reads, the pixels do not
    for _ in range(2):
        with pytest.raises(image_codec.ImageDecodeError, match="truncated or corrupt"):
            store_bytes(broken)
    assert len(decodes) == 2
