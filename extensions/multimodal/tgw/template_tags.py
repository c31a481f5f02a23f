"""Hugging Face's `{% generation %}` chat-template tag, where a host's Jinja environment lacks it.

llava-hf checkpoints (and others) mark the assistant's text in their chat templates with
`{% generation %}...{% endgeneration %}`, which transformers' own renderer knows (it finds the
assistant's tokens with it). text-generation-webui renders the model's template with its own Jinja
environment (`modules.chat.jinja_env`), which does not, so such a model's prompt cannot be built
at all ("Encountered unknown tag 'generation'"). The tag only marks text: its body is written as
is, as transformers writes it. Nothing here knows images.
"""
from __future__ import annotations

import importlib

from jinja2 import nodes
from jinja2.ext import Extension


class GenerationTag(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def add_generation_tag() -> bool:
    """Teach the host's template environment the tag, where it has one without it; True when added."""
    try:
        chat = importlib.import_module("modules.chat")
    except ImportError:
        return False
    environment = getattr(chat, "jinja_env", None)  # text-generation-webui's; this repository's host has none
    if environment is None or any("generation" in getattr(e, "tags", ()) for e in environment.extensions.values()):
        return False
    environment.add_extension(GenerationTag)
    return True
