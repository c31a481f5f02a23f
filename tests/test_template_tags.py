"""`{% generation %}` for a host's own Jinja environment (text-generation-webui renders templates with one).

llava-hf's chat template (the hub's llava-hf/llava-1.5-7b-hf writes it like this) marks the
assistant's text with the tag; a plain Jinja environment refuses to compile it.
"""
from __future__ import annotations

import pytest
from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from extensions.multimodal.tgw.template_tags import GenerationTag, add_generation_tag

LLAVA_HF = ("{% for message in messages %}{{ message['role'].upper() + ': ' }}{% if message['role'] != 'assistant' %}"
            "{{ message['content'] + ' ' }}{% else %}{% generation %}{{ message['content'] + ' ' }}{% endgeneration %}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and?"}]


def test_a_plain_environment_refuses_the_tag_and_one_with_it_writes_its_body():
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    with pytest.raises(TemplateSyntaxError, match="generation"):
        environment.from_string(LLAVA_HF)
    environment.add_extension(GenerationTag)
    rendered = environment.from_string(LLAVA_HF).render(messages=MESSAGES, add_generation_prompt=True)
    assert rendered == "USER: hi ASSISTANT: hello USER: and? ASSISTANT:"


def test_this_host_has_no_environment_of_its_own_to_teach():
    assert add_generation_tag() is False  # it renders with transformers, which knows the tag
