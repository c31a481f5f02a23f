"""Generation through the host's own Hugging Face path, with the processor's image tensors added.

text-generation-webui hands `model.generate()` the ids (and `inputs_embeds`) that the tokenizer
hook returned, and nothing else: no pixels, no Qwen grid, no Gemma 3 token types. Through its
`custom_generate_reply` hook this runs the host's own `generate_reply_HF` unchanged (its samplers,
seeds, stopping strings, streaming, stop button, EOS and token bans, logits processors), and adds
to its one `generate()` call the tensors the tokenizer hook left in `state[PROCESSOR_INPUTS]`.

`custom_generate_reply`'s arguments differ between versions: `(question, original_question, state,
stopping_strings, is_chat=...)` today, with a `seed` before `state` in the versions that shipped the
original extension. They are passed on as they came.
"""
from __future__ import annotations

from typing import Iterator

from extensions.multimodal.defaults import PROCESSOR_INPUTS
from modules import shared
from modules.text_generation import generate_reply_HF  # the host's own generation, in every host


def generate_reply(question: str, original_question: str, *args, **kwargs) -> Iterator[str]:
    state = next(arg for arg in args if isinstance(arg, dict))
    model = shared.model
    own = model.__dict__.get("generate")  # an instance attribute (a host's or a tool's wrapper) to restore
    delegate = model.generate

    def generate(*inner_args, **inner_kwargs):
        inner_kwargs.update(state.pop(PROCESSOR_INPUTS, None) or {})
        return delegate(*inner_args, **inner_kwargs)

    model.generate = generate
    try:
        yield from generate_reply_HF(question, original_question, *args, **kwargs)
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own
