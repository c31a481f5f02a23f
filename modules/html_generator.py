"""Rendering a visible chat history to HTML for the UI.

In: a history's `visible` turns (HTML-escaped text plus the image tags extensions add), and
optionally notices to show under the chat. Out: one HTML string for a `gr.HTML` component.

Image tags are the loaded extensions' business: the `image_tag_pattern` hook gives their regex
(the multimodal extension's, with named groups `mime` and `data`), and each match is rebuilt as an
`<img>` whose source is the picture's bytes, saved once in Gradio's upload folder and served by
Gradio (`gradio_api/file=`): the chat is rendered again at every streamed update, and a phone photo's
data is megabytes, which the page would otherwise receive again each time (tens of megabytes an
update with a few photos). Data that is not valid base64 stays a data URL, which shows nothing.
A message with pictures is rendered once (`RENDERED`, a `MessageMemo`). A picture's cost caption (`IMAGE_CAPTION`, which the host
writes right after the tag in the visible text only) is shown under that picture. Every other piece
of text, whatever it looks like, is shown as text. Visible text is stored HTML-escaped
(text-generation-webui's convention), so each text run is unescaped once and escaped again: text
stays readable, and a history file edited by hand cannot smuggle markup in. Without an extension
that writes image tags, tags (and captions) show as text.
This module does not decode images: the browser shows an `image/jpeg` or `image/png` file or data URL
as an image or not at all, it never runs it.
"""
from __future__ import annotations

import base64
import binascii
import html
import re
import urllib.parse
from typing import Optional


from modules.extensions import apply_extensions
from modules.message_memo import MessageMemo

# Characters html.escape leaves alone that template engines treat as syntax. Gradio 6's gr.HTML
# puts its value into a JS-template/Handlebars `html_template`; 6.31 does not re-evaluate the value
# (checked by hand: a raw `${1+1}` showed literally), but writing them as character references
# keeps that true whatever a later Gradio does with the value. They render identically.
TEMPLATE_SYNTAX = str.maketrans({"{": "&#123;", "}": "&#125;", "$": "&#36;", "`": "&#96;", "\\": "&#92;"})

CHAT_CSS = """
#chat-history { display: flex; flex-direction: column; gap: 10px; padding: 8px; min-height: 160px; }
#chat-history .message { padding: 8px 12px; border-radius: 10px; white-space: pre-wrap; overflow-wrap: anywhere;
                         max-width: 90%; }
#chat-history .user { align-self: flex-end; background: rgba(59,130,246,0.15); }
#chat-history .assistant { align-self: flex-start; background: rgba(120,120,120,0.15); }
#chat-history .message img { max-width: 300px; max-height: 300px; display: block; margin: 4px 0; border-radius: 6px; }
#chat-history .picture { margin: 4px 0; }
#chat-history .picture img { margin: 0; }
/* The caption is CSS-generated: it is the host's note about the picture, not the message's text (copying
   the message, or reading its text, leaves it out). */
#chat-history .picture::after { content: attr(data-caption); display: block; font-size: 0.8em; opacity: 0.7; }
#chat-history .empty { opacity: 0.6; font-style: italic; }
#chat-history .notice { align-self: stretch; padding: 6px 12px; border-radius: 8px; white-space: pre-wrap;
                        background: rgba(234,179,8,0.18); border-left: 4px solid rgb(234,179,8); }
"""

# What a picture costs in the prompt, written by the chat turn after the picture's tag in the visible text
# only: `IMAGE_CAPTION.format(tokens)`. Plain constants, so the turn runs none of this module's code.
IMAGE_CAPTION = '<span class="image-tokens">{:d} tokens</span>'
IMAGE_CAPTION_RE = re.compile(r'<span class="image-tokens">(?P<tokens>[0-9]{1,9}) tokens</span>')


def escape_plain(text: str) -> str:
    """Plain text -> HTML that shows exactly that text."""
    return html.escape(text, quote=True).translate(TEMPLATE_SYNTAX)


def escape_text(visible: str) -> str:
    """Visible (stored HTML-escaped, or hand-edited raw) text -> HTML showing it escaped exactly once."""
    return escape_plain(html.unescape(visible))


def image_tag_pattern() -> Optional[re.Pattern]:
    """The image-tag regex of the loaded extension that writes image tags, or None."""
    return apply_extensions("image_tag_pattern")


# A live chat's messages are the history's own strings; this bounds what chats already gone leave held.
RENDERED = MessageMemo(max_chars=256 * 2**20)


def picture_source(mime: str, data: str) -> str:
    """Where the page loads a picture from: its bytes saved in Gradio's upload folder (named by their hash,
    so saved once per picture), which Gradio serves at `gradio_api/file=` (relative: behind a proxy's
    path too); a data URL when `data` is not valid base64."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"data:{mime};base64,{data}"
    from gradio import processing_utils  # here: the chat turn imports this module, and runs without Gradio

    name = "picture.png" if mime == "image/png" else "picture.jpg"
    path = processing_utils.save_bytes_to_cache(raw, name, processing_utils.get_upload_folder())
    return "gradio_api/file=" + urllib.parse.quote(path)


def render_message(visible: str, pattern: Optional[re.Pattern], keep: bool = True) -> str:
    """HTML for one visible message: the image tags `pattern` matches (the loaded extension's,
    `image_tag_pattern`) as images, everything else as text. Kept by the message's text unless `keep` is
    False and it shows no picture. The chat is rendered again at every streamed update, on the thread that
    takes the GIL from the generating one between a step's kernels: a 40-turn chat's messages took
    1.2 ms to render again each time, against a few microseconds to look them up."""
    key = (visible, pattern.pattern if pattern is not None else None)
    rendered = RENDERED.get(key)
    if rendered is None:
        rendered, pictures = render_pictures(visible, pattern) if pattern is not None else (escape_text(visible), 0)
        if keep or pictures:
            RENDERED.put(key, rendered)
    return rendered


def render_pictures(visible: str, pattern: re.Pattern) -> tuple[str, int]:
    """(the message's HTML, how many pictures it shows)."""
    pieces, pictures = [], 0
    position = 0
    for pictures, match in enumerate(pattern.finditer(visible), start=1):
        pieces.append(escape_text(visible[position:match.start()]))
        picture = f'<img src="{escape_plain(picture_source(match.group("mime"), match.group("data")))}" alt="image">'
        position = match.end()
        caption = IMAGE_CAPTION_RE.match(visible, position)
        if caption is not None:  # only digits reach the attribute
            picture = f'<div class="picture" data-caption="{int(caption.group("tokens"))} tokens">{picture}</div>'
            position = caption.end()
        pieces.append(picture)
    pieces.append(escape_text(visible[position:]))
    return "".join(pieces), pictures


def strip_image_tags(text: str) -> str:
    """`text` without its image tags (e.g. to put a removed message back into the textbox)."""
    pattern = image_tag_pattern()
    stripped = pattern.sub("", IMAGE_CAPTION_RE.sub("", text)) if pattern is not None else text
    return stripped.strip() if stripped != text else text


def chat_html_wrapper(history: dict, notices: list[str] | None = None) -> str:
    """The whole chat: one row per non-empty visible message, then `notices` as plain text rows."""
    pattern = image_tag_pattern()
    messages = [(role, text) for user, bot in history.get("visible", [])
                for role, text in (("user", user), ("assistant", bot)) if text]
    # The last message may be a reply still streaming: each update's text is kept only if it shows a picture.
    rows = [f'<div class="message {role}">{render_message(text, pattern, keep=index < len(messages) - 1)}</div>'
            for index, (role, text) in enumerate(messages)]
    if not rows:
        rows.append('<div class="empty">No messages yet.</div>')
    for notice in notices or []:
        rows.append(f'<div class="notice" role="alert">{escape_plain(notice)}</div>')
    return f'<div id="chat-history">{"".join(rows)}</div>'
