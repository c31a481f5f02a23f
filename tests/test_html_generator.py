"""html_generator: only the image tags of the loaded extension render as markup; every other text is shown as text.

The tag's regex comes from the multimodal extension's `image_tag_pattern` hook (loaded by the
autouse fixture below). The rendered HTML is parsed back with Python's HTML parser (what a browser
builds from it): the checks are on the resulting elements and text, not on string shapes.
"""
from __future__ import annotations

import base64
import html
import io
import re
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from gradio import processing_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
from modules import extensions
from modules.html_generator import chat_html_wrapper, image_tag_pattern, render_message, strip_image_tags


@pytest.fixture(autouse=True)
def multimodal_hooks(host):
    """The multimodal extension loaded as far as its hooks (no model needed to render)."""
    extensions.state["multimodal"] = [True, 0]


def jpeg_b64(color=(200, 30, 30)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buffer, format="JPEG")
    return base64.b64encode(buffer.getvalue()).decode()


B64 = jpeg_b64()
TAG = f'<img src="data:image/jpeg;base64,{B64}">'


def render_text(visible: str) -> str:
    """One message as the chat renders it, with the loaded extension's image-tag pattern."""
    return render_message(visible, image_tag_pattern())


class Parsed(HTMLParser):
    """The elements (tag, attrs) and the text a browser would build from an HTML string."""

    def __init__(self, markup: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.text = ""
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag == "img":
            self.text += "[IMG]"

    def handle_data(self, data):
        self.text += data


def images(markup: str) -> list[dict]:
    return [attrs for tag, attrs in Parsed(markup).elements if tag == "img"]


SERVED = re.compile(r"gradio_api/file=(?P<path>[^\"?#]+\.(?:jpg|png))")


def shown_bytes(src: str) -> bytes:
    """The bytes the page loads for an image source: a file Gradio serves from its upload folder, or a
    data URL's (where the data is not valid base64)."""
    served = SERVED.fullmatch(src)
    if served is None:
        return base64.b64decode(src.split(",", 1)[1])
    path = Path(urllib.parse.unquote(served.group("path")))
    assert path.resolve().is_relative_to(Path(processing_utils.get_upload_folder()).resolve()), path
    return path.read_bytes()


def assert_inert(markup: str) -> None:
    """No element but div/img, no event handler attribute, images only as JPEG or PNG files Gradio serves
    from its upload folder, or JPEG or PNG data URLs."""
    for tag, attrs in Parsed(markup).elements:
        assert tag in ("div", "img"), f"unexpected element <{tag}> in {markup!r}"
        assert not any(name.startswith("on") for name in attrs), attrs
        if tag == "img":
            assert set(attrs) == {"src", "alt"} and (SERVED.fullmatch(attrs["src"]) or attrs["src"].startswith(
                ("data:image/jpeg;base64,", "data:image/png;base64,"))), attrs


def test_exact_jpeg_tag_renders_as_an_image_between_text():
    markup = render_text(f"before {TAG} after")
    assert [(a["src"].endswith(".jpg"), shown_bytes(a["src"]), a["alt"]) for a in images(markup)] == \
        [(True, base64.b64decode(B64), "image")]
    assert Parsed(markup).text == "before [IMG] after"
    assert_inert(markup)


def test_a_png_tag_renders_as_a_png_image():
    markup = render_text(f'<img src="data:image/png;base64,{B64}">')
    assert [(a["src"].endswith(".png"), shown_bytes(a["src"])) for a in images(markup)] == \
        [(True, base64.b64decode(B64))]
    assert_inert(markup)


def test_a_chat_with_a_large_picture_renders_small_and_once(monkeypatch):
    """The chat is rendered again at every streamed update: the page gets the picture's address, not its
    megabytes, and the picture is saved once, not at every update."""
    photo = base64.b64encode(np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()).decode()
    history = {"visible": [[f'<img src="data:image/jpeg;base64,{photo}">What is it?', "A"]], "internal": [["", ""]]}
    saved = []
    real_save = processing_utils.save_bytes_to_cache
    monkeypatch.setattr(processing_utils, "save_bytes_to_cache", lambda *args: saved.append(1) or real_save(*args))
    for reply in ("A", "A photo", "A photo of"):
        history["visible"][0][1] = reply
        markup = chat_html_wrapper(history)
        assert len(markup) < 1000 and Parsed(markup).text == f"[IMG]What is it?{reply}"
    assert len(saved) == 1 and shown_bytes(images(markup)[0]["src"]) == base64.b64decode(photo)


def test_a_tag_whose_data_is_not_base64_stays_a_data_url():
    markup = render_text('<img src="data:image/jpeg;base64,AAAAA">')  # a length base64 cannot have
    assert images(markup) == [{"src": "data:image/jpeg;base64,AAAAA", "alt": "image"}]
    assert_inert(markup)


def test_without_an_extension_that_writes_tags_they_show_as_text():
    extensions.state.clear()
    markup = render_text(f"before {TAG} after")
    assert images(markup) == [] and Parsed(markup).text == f"before {TAG} after"
    assert_inert(markup)


def test_several_images_keep_their_order():
    other = jpeg_b64((10, 200, 10))
    markup = render_text(f'{TAG}<img src="data:image/jpeg;base64,{other}">text')
    assert [shown_bytes(a["src"]) for a in images(markup)] == [base64.b64decode(B64), base64.b64decode(other)]
    assert Parsed(markup).text == "[IMG][IMG]text"


PAYLOADS = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    f'<img src="data:image/gif;base64,{B64}">',                # another MIME type
    f'<img src="data:image/jpeg;base64,{B64}" onerror="window.__pwned = 3">',  # an extra attribute
    f"<img src='data:image/jpeg;base64,{B64}'>",               # other quotes
    f'<IMG src="data:image/jpeg;base64,{B64}">',               # other case
    f'<img  src="data:image/jpeg;base64,{B64}">',              # other spacing
    f'<img src="data:image/jpeg;base64,{B64}"/>',              # self-closing
    f'<img src="data:image/jpeg;base64,{B64}',                 # a half tag
    '<img src="data:image/jpeg;base64,AAAA"><b',               # a tag, then half a tag
    "<svg onload=alert(1)>",
    "<a href=\"javascript:alert(1)\">link</a>",
    "<style>body{display:none}</style>",
    "<!-- comment --> &lt;b&gt; &amp;amp;",
]


def test_html_in_text_is_shown_as_text():
    for payload in PAYLOADS:
        shown = payload.replace('<img src="data:image/jpeg;base64,AAAA">', "[IMG]")
        markup = render_text(payload)
        assert_inert(markup)
        assert Parsed(markup).text == html.unescape(shown), payload


def test_stored_escaped_text_is_shown_escaped_once():
    """chat.py stores visible text with html.escape: the user sees what they typed, not entities."""
    for typed in PAYLOADS + ["a & b < c", "&amp;", "tom's \"quote\""]:
        markup = render_text(html.escape(typed))
        assert Parsed(markup).text == typed
        assert not images(markup), "an escaped image tag the user typed is text, not an image"


def test_template_syntax_reaches_the_page_inert():
    markup = render_text("${1+1} {{value}} `x` \\n")
    assert "${" not in markup and "{{" not in markup and "`" not in markup
    assert Parsed(markup).text == "${1+1} {{value}} `x` \\n"


def test_chat_html_wrapper_rows_and_notices():
    history = {"visible": [["<b>hi</b>", "<i>yo</i>"], [TAG, ""]], "internal": [["", ""], ["", ""]]}
    markup = chat_html_wrapper(history, notices=["Removed 1 image(s) <script>x</script> &amp;"])
    parsed = Parsed(markup)
    classes = [attrs.get("class") for tag, attrs in parsed.elements if tag == "div"]
    assert classes == [None, "message user", "message assistant", "message user", "notice"]
    assert parsed.text == "<b>hi</b><i>yo</i>[IMG]Removed 1 image(s) <script>x</script> &amp;"
    assert_inert(markup)


def test_empty_history_says_so():
    assert Parsed(chat_html_wrapper({"visible": [], "internal": []})).text == "No messages yet."


def test_strip_image_tags():
    assert strip_image_tags(f"{TAG}\n{TAG}\nWhat is this?") == "What is this?"
    assert strip_image_tags("  no images  ") == "  no images  "


PIECES = st.sampled_from(["<", ">", "\"", "'", "&", "=", "/", " ", "img", "src", "script", "on", "error",
                          "data:image/jpeg;base64,", "data:image/png;base64,", "AAAA", "amp;", "lt;", "#60;",
                          "{", "}", "$", "`", "\n", "é", TAG])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=30).map("".join))
def test_any_text_renders_inert_and_keeps_its_characters(text):
    markup = render_text(text)
    assert_inert(markup)
    expected = IMAGE_TAG_RE.sub("\x00", text)
    shown = "[IMG]".join(html.unescape(part) for part in expected.split("\x00"))
    assert Parsed(markup).text == shown


# -- A picture's cost caption (the host writes it after the tag, in the visible text only) --------------

def test_a_caption_after_a_tag_shows_under_that_picture_and_not_as_text():
    from modules.html_generator import IMAGE_CAPTION

    markup = render_text(f"{TAG}{IMAGE_CAPTION.format(576)}{TAG}{IMAGE_CAPTION.format(1)}What?")
    parsed = Parsed(markup)
    pictures = [attrs for tag, attrs in parsed.elements if tag == "div"]
    assert pictures == [{"class": "picture", "data-caption": "576 tokens"}, {"class": "picture", "data-caption": "1 tokens"}]
    assert parsed.text == "[IMG][IMG]What?", "the caption is no message text"
    assert_inert(markup)
    assert strip_image_tags(f"{TAG}{IMAGE_CAPTION.format(576)}What?") == "What?"


def test_a_caption_anywhere_else_or_not_exactly_the_hosts_shows_as_text():
    from modules.html_generator import IMAGE_CAPTION

    loose = f"before {IMAGE_CAPTION.format(5)} after"
    assert Parsed(render_text(loose)).text == loose
    forged = f'{TAG}<span class="image-tokens">5 tokens" onmouseover="x</span>'
    markup = render_text(forged)
    assert 'class="picture"' not in markup and Parsed(markup).text.startswith("[IMG]<span")
    assert_inert(markup)


def test_a_streamed_update_renders_only_the_message_that_changed(monkeypatch):
    """The chat is rendered again at every streamed update: the messages before the last are looked up,
    only the reply being written is rendered, and none of its partial texts is kept. The HTML is the
    same as rendering every message afresh."""
    from modules import html_generator

    history = {"internal": [], "visible": []}
    for turn in range(30):
        user = (TAG if turn % 7 == 0 else "") + f"Question {turn} &lt;b&gt;"
        history["visible"].append([user, f"Answer {turn}."])
    first = chat_html_wrapper(history)
    rendered = []
    escape = html_generator.escape_text
    monkeypatch.setattr(html_generator, "escape_text", lambda text: rendered.append(text) or escape(text))
    for partial in ("The", "The reply", "The reply so far"):
        history["visible"][-1][1] = partial
        update = chat_html_wrapper(history)
    assert rendered == ["The", "The reply", "The reply so far"]
    assert ("The reply", None) not in html_generator.RENDERED.entries and \
        ("The reply", IMAGE_TAG_RE.pattern) not in html_generator.RENDERED.entries
    html_generator.RENDERED.entries.clear()
    html_generator.RENDERED.chars = 0
    assert chat_html_wrapper(history) == update and update.startswith(first[:first.index("Answer 29.")])
