"""Image codec: the history's `<img>` tag <-> bytes <-> PIL images.

The tag is defined here, once: `IMAGE_TAG_RE` reads it (named groups `mime` and `data`), `make_tag`
writes it. The host learns it through the extension's `image_tag_pattern()` hook (to render images
in the chat), never from a copy. `find_tags` finds what `IMAGE_TAG_RE.finditer` finds, faster, for the
prompts read at every turn (tests/test_multimodal_codec.py keeps the two equal).
In: a base64 string found by `IMAGE_TAG_RE`, or raw bytes in any format Pillow reads (older
histories hold PNG bytes under the jpeg label; the API hands over WebP, GIF, ...).
Out: upright RGB images (alpha flattened onto white, EXIF orientation applied, first frame of an
animation): the pixels a pipeline gets, decoded once from the bytes the history stores.
Storing (`store_bytes`, `store_image`): the model must see the picture that was sent, so a JPEG's
bytes are kept as they came and a PNG's too; other formats (WebP, GIF, BMP, ...) and already decoded
pictures are stored as a lossless PNG of their upright RGB pixels. Only the `jpeg` history format
(a setting, for small histories) re-encodes, and says so (`Stored.changed`).
Every failure to read an image is an `ImageDecodeError` (a `ValueError`) naming the image and the
cause. This module knows nothing about prompts, tokens or pipelines.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from io import BytesIO
from typing import Iterator, NamedTuple, Optional

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from extensions.multimodal.core.bounded_lru import BoundedLRU
from extensions.multimodal.core.defaults import DEFAULT_PARAMS

# The tag the extension writes and reads: `<img src="data:image/jpeg;base64,...">` as the technical
# description fixes it, and `image/png` for lossless pictures. Only base64 characters in the data
# and two MIME types: a match can never carry markup.
IMAGE_TAG_RE = re.compile(r'<img src="data:(?P<mime>image/(?:jpeg|png));base64,(?P<data>[A-Za-z0-9+/=]+)">')
TAG_TEMPLATE = '<img src="data:{mime};base64,{data}">'
TAG_HEADS = tuple((mime, f'<img src="data:{mime};base64,') for mime in ("image/jpeg", "image/png"))
BASE64_CHARACTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
DATA_URL_PREFIX = "data:image/"  # how today's text-generation-webui hands pictures over

DEFAULT_MAX_PIXELS = DEFAULT_PARAMS["max_image_pixels"]
# A picture is decoded when it is stored (a broken one is refused at once) and again when its tag is
# first read for the model, moments later: a phone photo's decode takes ~0.1 s on the way to the first
# token. So `store_bytes` keeps the pixels it decoded, by the bytes stored, for that first read (taken,
# not shared: a pipeline may modify its picture). Pictures never read are evicted past this size.
STORED_PIXELS_BYTES = 160 * 2**20
_stored_pixels = BoundedLRU(STORED_PIXELS_BYTES)
# Pictures stored as sent, by the SHA-256 of their bytes and the limits they were checked under: an
# OpenAI-style client sends every picture of the conversation again with each request, and checking a
# phone photo again means decoding it (~60 ms for 12 MP), where hashing its bytes takes ~3. Only the
# pictures that passed are kept (a small entry each): a broken one is decoded, and refused, every time.
_kept_as_sent = BoundedLRU(2**20)
# Tags' data already checked, with its SHA-256, by its length and last characters. A chat prompt carries
# every picture of its history again at every turn: checking a phone photo's characters and hashing
# them takes ~7 ms, comparing them with the data kept takes ~0.5 (one memcmp). Only data equal to the
# kept string, character for character, is taken for it. Bounded by characters: past it, the pictures
# least recently read are checked again when they come back.
CHECKED_DATA_CHARS = 128 * 2**20
_checked_data = BoundedLRU(CHECKED_DATA_CHARS)
DATA_KEY_TAIL = 64  # the data's last characters in its key: a JPEG's first ones are alike
_as_read = BoundedLRU(32 * 2**20)  # `as_read_data_url`'s re-encoded pictures, by digest (rare: small)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_QUALITY = 90
WHITE = (255, 255, 255)
# How pictures are stored in the history (the `history_image_format` param).
EXACT, JPEG = "exact", "jpeg"
HISTORY_FORMATS = (EXACT, JPEG)
# Pillow formats whose bytes the history keeps as sent, with their tag's MIME type (MPO: a phone's JPEG).
KEPT_FORMATS = {"JPEG": "image/jpeg", "MPO": "image/jpeg", "PNG": "image/png"}
# Bumped whenever decoding/normalising changes pixels: it is part of the embedding cache key.
CODEC_VERSION = "1"
EXIF_ORIENTATION = 0x0112
ORIENTATIONS_SWAPPING_AXES = {5, 6, 7, 8}
ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
HIGH_BIT_DEPTH_MODES = {"I", "F", "I;16", "I;16L", "I;16B", "I;16N"}


class ImageDecodeError(ValueError):
    """An image that cannot be read: bad base64, not an image, truncated, too large, ..."""
    code = "invalid_image"  # hosts that answer with error codes (the API) use it


class Tag(NamedTuple):
    """One tag in a text: `text[start:end]` is the whole tag, `data` its base64 data, `digest` the
    SHA-256 of that data (the picture's identity for the caches)."""
    start: int
    end: int
    mime: str
    data: str
    digest: bytes


class CheckedData(NamedTuple):
    data: str
    digest: bytes


def find_tags(text: str) -> Iterator[Tag]:
    """The tags `IMAGE_TAG_RE.finditer(text)` matches, in order. A chat prompt carries every picture of
    the history, megabytes of base64 each, and is read several times per turn: the regular expression
    checks the data a character at a time (~45 ms for 19 MB here), string searches and one
    `bytes.translate` do it in ~8."""
    position = 0
    while (start := text.find('<img src="data:image/', position)) >= 0:
        tag = tag_at(text, start)
        if tag is None:
            position = start + 1
            continue
        yield tag
        position = tag.end


def tag_at(text: str, start: int) -> Optional[Tag]:
    """The tag `IMAGE_TAG_RE.match(text, start)` matches, or None: its head, then base64 characters up
    to the first quote, which must close the tag."""
    for mime, head in TAG_HEADS:
        if text.startswith(head, start):
            data_start = start + len(head)
            quote = text.find('"', data_start)
            if quote <= data_start or not text.startswith('">', quote):
                return None
            checked = checked_data(text, data_start, quote)
            return None if checked is None else Tag(start, quote + 2, mime, *checked)
    return None


def checked_data(text: str, start: int, end: int) -> Optional[CheckedData]:
    """`text[start:end]` with its SHA-256 if it holds only base64 characters, else None; the very string
    kept from an earlier check when the data is the same."""
    key = (end - start, text[max(start, end - DATA_KEY_TAIL):end])
    kept = _checked_data.get(key)
    if kept is not None and text.startswith(kept.data, start):  # same length: the same data
        return kept
    data = text[start:end]
    if not data.isascii():
        return None
    raw = data.encode("ascii")
    if raw.translate(None, BASE64_CHARACTERS):
        return None
    checked = CheckedData(data, hashlib.sha256(raw).digest())
    _checked_data.put(key, checked, len(data))
    return checked


def has_tag(text: str) -> bool:
    return next(find_tags(text), None) is not None


def make_tag(data: bytes, mime: str = "image/jpeg") -> str:
    return TAG_TEMPLATE.format(mime=mime, data=base64.b64encode(data).decode("ascii"))


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def image_label(index: Optional[int]) -> str:
    """How errors name an image: `index` is 0-based among the prompt's images, None for a lone image."""
    return "the image" if index is None else f"the {ordinal(index + 1)} image in the prompt"


def b64_to_bytes(b64: str, label: str = "the image") -> bytes:
    """Strict base64 decoding (length and alphabet checked); never returns empty bytes."""
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageDecodeError(f"Cannot read {label}: its base64 data is invalid ({error}, "
                               f"{len(b64)} characters). Send the image again.") from error
    if not data:
        raise ImageDecodeError(f"Cannot read {label}: it holds no bytes. Send the image again.")
    return data


def data_url_bytes(url: str, label: str = "the image") -> bytes:
    """A `data:image/...;base64,...` URL's bytes, decoded as strictly as a tag's."""
    if not url.startswith(DATA_URL_PREFIX) or ";base64," not in url:
        raise ImageDecodeError(f"Cannot read {label}: expected a data:image/...;base64 URL, got {url[:40]!r}.")
    return b64_to_bytes(url.split(",", 1)[1], label)


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, label: str = "the image") -> Image.Image:
    """Open `data` reading only its header: the pixel count is checked before anything is decoded.

    The result is lazy (not `.load()`ed): its `.size` and `.mode` are known, its pixels are not.
    """
    if not data:
        raise ImageDecodeError(f"Cannot read {label}: it holds no bytes (0-byte file).")
    try:
        image = Image.open(BytesIO(data))
    except Image.DecompressionBombError as error:  # Pillow's own guard, left on
        raise ImageDecodeError(f"Cannot read {label}: {error}") from error
    except UnidentifiedImageError as error:
        raise ImageDecodeError(f"Cannot read {label}: its {len(data)} bytes (starting with {data[:8]!r}) are not "
                               f"an image format Pillow reads. Send a JPEG, PNG, WebP or GIF.") from error
    except Exception as error:  # Pillow raises many types on hostile headers (its own fuzzers catch Exception)
        raise ImageDecodeError(f"Cannot read {label}: its {len(data)} bytes (starting with {data[:8]!r}) have a "
                               f"broken image header ({type(error).__name__}: {error}).") from error
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageDecodeError(f"Cannot read {label}: its size is {width}x{height}.")
    if width * height > max_pixels:
        raise ImageDecodeError(
            f"Cannot read {label}: it is {width}x{height} = {width * height:,} pixels, more than the limit of "
            f"{max_pixels:,} (the multimodal-max_image_pixels setting). Send a smaller image.")
    return image


def decode_image_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, label: str = "the image") -> Image.Image:
    """Any Pillow format -> a loaded, upright RGB image (the first frame of an animation)."""
    stored = _stored_pixels.take(data)
    if stored is not None and stored.width * stored.height <= max_pixels:
        return stored
    return decode_opened(open_image(data, max_pixels, label), label)


def decode_opened(image: Image.Image, label: str = "the image") -> Image.Image:
    """An `open_image` result -> its loaded, upright RGB pixels."""
    try:
        image.load()
        # In place: the picture is this call's own, and an upright one is not copied (36 MB for 12 MP).
        ImageOps.exif_transpose(image, in_place=True)
        return to_rgb(image)
    except Image.DecompressionBombError as error:
        raise ImageDecodeError(f"Cannot read {label}: {error}") from error
    except Exception as error:  # truncated or corrupt data: Pillow raises OSError, ValueError, SyntaxError, ...
        raise ImageDecodeError(f"Cannot read {label} ({image.format or 'unknown'} {image.size[0]}x{image.size[1]}): "
                               f"the data is truncated or corrupt ({type(error).__name__}: {error}). Send the image "
                               f"again.") from error


def tag_b64_to_image(b64: str, max_pixels: int = DEFAULT_MAX_PIXELS, label: str = "the image") -> Image.Image:
    """The base64 part of an image tag -> a loaded, upright RGB image."""
    return decode_image_bytes(b64_to_bytes(b64, label), max_pixels, label)


def as_read_data_url(tag: Tag, max_pixels: int = DEFAULT_MAX_PIXELS) -> str:
    """The tag's picture as a data URL that another reader (a vLLM engine) reads as this codec does: the
    bytes as sent, except a 16-bit greyscale PNG's. Pillow's plain `convert("RGB")`, which vLLM runs,
    clips those values at 255 (a nearly white picture) where `to_8bit_gray` scales them: that picture
    goes as an 8-bit PNG of the pixels read here, made once."""
    if not is_16_bit_grey_png(tag):
        return f"data:{tag.mime};base64,{tag.data}"
    url = _as_read.get((tag.digest, max_pixels))
    if url is None:
        png = image_to_png_bytes(tag_b64_to_image(tag.data, max_pixels))
        url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        _as_read.put((tag.digest, max_pixels), url, len(url))
    return url


def is_16_bit_grey_png(tag: Tag) -> bool:
    """From the PNG's IHDR chunk, which comes first: bit depth 16, colour type 0 (Pillow's `I;16`)."""
    if tag.mime != "image/png" or len(tag.data) < 44:
        return False
    head = base64.b64decode(tag.data[:44])  # 33 bytes: the signature, then IHDR's length, name and data
    return head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR" and head[24:26] == b"\x10\x00"


def image_for_counting(b64: str, max_pixels: int = DEFAULT_MAX_PIXELS, label: str = "the image") -> Image.Image:
    """An image whose `.size` is the upright size; for a plain JPEG only its header is read.

    For pipelines whose token count depends on the image size: reading a header is cheap. A JPEG
    keeps its EXIF block in front of the pixels; other formats (older histories) may keep it
    after them, so those, and JPEGs whose EXIF turns them sideways, are decoded fully.
    """
    data = b64_to_bytes(b64, label)
    image = open_image(data, max_pixels, label)
    if image.format != "JPEG":
        return decode_image_bytes(data, max_pixels, label)
    try:
        orientation = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # a malformed EXIF block: the full decode reports it properly
        orientation = None
    if orientation in ORIENTATIONS_SWAPPING_AXES or orientation is None:
        return decode_image_bytes(data, max_pixels, label)
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB with transparency flattened onto white (models were trained on opaque images)."""
    if image.mode in HIGH_BIT_DEPTH_MODES:
        image = to_8bit_gray(image)
    has_alpha = image.mode in ALPHA_MODES or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def to_8bit_gray(image: Image.Image) -> Image.Image:
    # Pillow's convert() clips 16-bit values at 255 (a mostly white image); scale them instead.
    values = np.asarray(image, dtype=np.float64)
    if image.mode.startswith("I;16") or values.max(initial=0) > 255:
        values = values / 257.0
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))


def cap_size(image: Image.Image, max_side: Optional[int]) -> Image.Image:
    """Downscale so the longest side is at most `max_side`; never upscales."""
    if max_side is None or max(image.size) <= max_side:
        return image
    scale = max_side / max(image.size)
    size = (max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def image_to_jpeg_bytes(image: Image.Image, max_side: Optional[int] = None) -> bytes:
    buffer = BytesIO()
    cap_size(to_rgb(image), max_side).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def image_to_png_bytes(image: Image.Image) -> bytes:
    """A lossless PNG of the image's upright RGB pixels (what decoding it gives back, exactly)."""
    buffer = BytesIO()
    to_rgb(image).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class Stored:
    """A picture as the history keeps it."""
    data: bytes
    mime: str  # image/jpeg or image/png, as the bytes are
    changed: bool  # its pixels differ from those sent (the `jpeg` history format re-encoded or shrank it)

    @property
    def tag(self) -> str:
        return make_tag(self.data, self.mime)


def check_history_format(history_format: str) -> str:
    if history_format not in HISTORY_FORMATS:
        raise ValueError(f"multimodal-history_image_format={history_format!r}: expected one of {', '.join(HISTORY_FORMATS)}")
    return history_format


def store_bytes(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, label: str = "the image",
                history_format: str = EXACT, max_side: Optional[int] = None) -> Stored:
    """Bytes in any Pillow format -> what the history keeps. Decodes them once (a broken or oversized
    picture raises ImageDecodeError now, not at generation time); `max_side` bounds the `jpeg` format.
    The same bytes stored as sent before, under the same limits, are not decoded again."""
    key = (hashlib.sha256(data).digest(), max_pixels, check_history_format(history_format), max_side)
    mime = _kept_as_sent.get(key)
    if mime is not None:
        return Stored(data, mime, changed=False)
    image = open_image(data, max_pixels, label)
    pixels = decode_opened(image, label)
    stored = stored_as(data, KEPT_FORMATS.get(image.format), pixels, history_format, max_side)
    if not stored.changed:  # its bytes decode to these pixels (a PNG written from them too)
        _stored_pixels.put(stored.data, pixels, pixel_nbytes(pixels) + len(stored.data))
    if stored.data is data:
        _kept_as_sent.put(key, stored.mime, 128)
    return stored


def stored_as(data: bytes, kept: Optional[str], pixels: Image.Image, history_format: str,
              max_side: Optional[int]) -> Stored:
    if check_history_format(history_format) == JPEG:
        if kept == "image/jpeg" and (max_side is None or max(pixels.size) <= max_side):
            return Stored(data, kept, changed=False)
        return Stored(image_to_jpeg_bytes(pixels, max_side), "image/jpeg", changed=True)
    if kept is not None:
        return Stored(data, kept, changed=False)
    return Stored(image_to_png_bytes(pixels), "image/png", changed=False)


def pixel_nbytes(image: Image.Image) -> int:
    return image.width * image.height * len(image.getbands())


def store_image(image: Image.Image, history_format: str = EXACT, max_side: Optional[int] = None) -> Stored:
    """An already decoded picture (a UI's PIL image) -> what the history keeps: its pixels, losslessly."""
    if check_history_format(history_format) == JPEG:
        return Stored(image_to_jpeg_bytes(image, max_side), "image/jpeg", changed=True)
    return Stored(image_to_png_bytes(image), "image/png", changed=False)
