"""Rendering a visible chat history to HTML for the UI.

Only image tags of the exact form `<img src="data:image/jpeg;base64,...">` are kept as HTML; every
other piece of text, whatever it looks like, is shown as text. Visible text is stored HTML-escaped
(text-generation-webui's convention), so each text run is unescaped once and escaped again: text
stays readable, and a history file edited by hand cannot smuggle markup in.
"""
from __future__ import annotations

import html
import re

# The one image tag form the multimodal extension writes (see its technical description).
IMAGE_TAG = re.compile(r'<img src="data:image/jpeg;base64,([A-Za-z0-9+/=]+)">')

CHAT_CSS = """
#chat-history { display: flex; flex-direction: column; gap: 10px; padding: 8px; min-height: 120px; }
#chat-history .message { padding: 8px 12px; border-radius: 10px; white-space: pre-wrap; word-wrap: break-word; max-width: 90%; }
#chat-history .user { align-self: flex-end; background: rgba(59,130,246,0.15); }
#chat-history .assistant { align-self: flex-start; background: rgba(120,120,120,0.15); }
#chat-history .message img { max-width: 300px; max-height: 300px; display: block; margin: 4px 0; border-radius: 6px; }
#chat-history .empty { opacity: 0.6; font-style: italic; }
"""


def render_text(visible: str) -> str:
    """HTML for one visible message: image tags as images, everything else as text."""
    pieces = []
    position = 0
    for match in IMAGE_TAG.finditer(visible):
        pieces.append(escape_text(visible[position:match.start()]))
        pieces.append(f'<img src="data:image/jpeg;base64,{match.group(1)}" alt="image">')
        position = match.end()
    pieces.append(escape_text(visible[position:]))
    return "".join(pieces)


def escape_text(text: str) -> str:
    return html.escape(html.unescape(text), quote=True)


def chat_html_wrapper(history: dict) -> str:
    rows = []
    for user, bot in history.get("visible", []):
        if user:
            rows.append(f'<div class="message user">{render_text(user)}</div>')
        if bot:
            rows.append(f'<div class="message assistant">{render_text(bot)}</div>')
    if not rows:
        rows.append('<div class="empty">No messages yet.</div>')
    return f'<div id="chat-history">{"".join(rows)}</div>'
