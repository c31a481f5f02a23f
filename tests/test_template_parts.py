"""Hub chat templates rendered the way text-generation-webui renders them (every message's content a
string, pictures as `<__media__>` markers or history tags), through `template_parts.PartsTemplate`,
against transformers' own rendering of the same conversation with content as parts.

The environment here is a plain Jinja sandbox with the `{% generation %}` tag (what the extension
adds to text-generation-webui's); text-generation-webui itself runs these templates in
tools/check_in_tgw.sh.
"""
from __future__ import annotations

from datetime import datetime

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils.chat_template_utils import render_jinja_template

from extensions.multimodal.core.image_codec import make_tag
from extensions.multimodal.tgw.template_parts import PartsTemplate
from extensions.multimodal.tgw.template_tags import GenerationTag
from fixtures.vlm_families import AYA_TEMPLATE, HUB_TEMPLATES, TEMPLATE_IMAGE_TEXT, hub_template

FAMILIES = sorted(path.stem for path in HUB_TEMPLATES.glob("*.jinja"))
PARTS_ONLY = ["idefics3", "llava", "llava_next", "llava_onevision", "smolvlm"]
TAG = make_tag(b"\xff\xd8 not decoded here", "image/jpeg")
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def environment(parts: bool) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag])
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)  # Mistral 3 writes the date
    if parts:
        env.template_class = PartsTemplate
    return env


def as_host_sends(picture: str) -> list[dict]:
    """A three-turn chat as text-generation-webui renders it: strings, the picture before the words."""
    return [{"role": "user", "content": f"{picture}\n\nWhat is in this picture?"},
            {"role": "assistant", "content": "A red square."},
            {"role": "user", "content": "And this one?\n\n" + picture},
            {"role": "assistant", "content": "A blue circle."},
            {"role": "user", "content": "Which one is larger?"}]


def as_parts() -> list[dict]:
    """The same chat as Hugging Face's processors take it."""
    def text(words: str) -> dict:
        return {"type": "text", "text": words}

    return [{"role": "user", "content": [{"type": "image"}, text("What is in this picture?")]},
            {"role": "assistant", "content": [text("A red square.")]},
            {"role": "user", "content": [text("And this one?"), {"type": "image"}]},
            {"role": "assistant", "content": [text("A blue circle.")]},
            {"role": "user", "content": [text("Which one is larger?")]}]


def hugging_face(template: str, messages: list[dict]) -> str:
    rendered, _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True, **TOKENS)
    return rendered[0]


@pytest.mark.parametrize("picture", ["<__media__>", TAG], ids=["marker", "tag"])
@pytest.mark.parametrize("family", FAMILIES + ["aya_vision"])
def test_each_picture_and_word_lands_where_hugging_face_puts_it(family, picture):
    template = AYA_TEMPLATE if family == "aya_vision" else hub_template(family)
    rendered = environment(parts=True).from_string(template).render(messages=as_host_sends(picture),
                                                                     add_generation_prompt=True, **TOKENS)
    assert rendered.count(picture) == 2
    # Where the host's picture stands, Hugging Face's rendering has the template's text for an image part.
    assert rendered.replace(picture, TEMPLATE_IMAGE_TEXT[family]) == hugging_face(template, as_parts())


@pytest.mark.parametrize("family", PARTS_ONLY)
def test_the_hub_templates_that_take_only_parts_lose_the_words_without_it(family):
    """The control: rendered from strings as the host passes them, these templates drop the user's words."""
    try:
        rendered = environment(parts=False).from_string(hub_template(family)).render(
            messages=as_host_sends("<__media__>"), add_generation_prompt=True, **TOKENS)
    except Exception as error:  # LLaVA-NeXT's reads message['content'][0]['text']
        assert "text" in str(error)
        return
    assert "What is in this picture?" not in rendered


def test_a_template_for_strings_is_left_as_it_renders():
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    messages = as_host_sends("<__media__>")
    assert (environment(parts=True).from_string(template).render(messages=messages) ==
            environment(parts=False).from_string(template).render(messages=messages))


def test_typed_image_text_falls_back_to_strings():
    """A user who types the template's image text: the pictures cannot be told apart from it, so the
    message renders as the host passed it (Qwen's template takes strings too)."""
    template = hub_template("qwen2_5_vl")
    messages = [{"role": "user", "content": "<__media__>\n\nIs <|vision_start|><|image_pad|><|vision_end|> a token?"}]
    rendered = environment(parts=True).from_string(template).render(messages=messages, add_generation_prompt=True)
    assert rendered == environment(parts=False).from_string(template).render(messages=messages,
                                                                           add_generation_prompt=True)
