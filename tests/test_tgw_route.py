"""The text-generation-webui route, end to end in this process: a defect there fails here first.

text-generation-webui has no `modules.model_inputs` (the feature `loaded_model.host_builds_routes`
detects); there the extension generates for image-text checkpoints through its `custom_generate_reply`
hook, which runs the host's `generate_reply_HF` with the inputs of its one `generate()` call replaced
(tgw/generation.py). Here the host is this repository's, with that feature hidden, and
`generate_reply_HF` is the part of text-generation-webui 1dcde41d's (`modules/text_generation.py`
406-457) that decides those inputs: `encode(question)`, the extensions' tokenizer hook, then
`model.generate(inputs=ids[, inputs_embeds=...], eos_token_id, logits_processor, ...)` and the reply
from the new ids. The model, the extension and the reference are real: greedy replies must be token
for token Hugging Face's `generate` on its processor's inputs for the same conversation, on the fast
path (features by content, the KV cache kept between turns, cut back for a regenerate) and on the
processor route.

`tools/check_in_tgw.sh` runs the same inside text-generation-webui itself, at its own pins.
"""
from __future__ import annotations

import logging
import re

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, LogitsProcessorList

from modules import shared
from modules.text_generation import encode
from fixtures import hf_reference
from fixtures.vlm_families import TEMPLATE_IMAGE_TEXT

NEW_TOKENS = 6
QUESTIONS = ["What is in the picture?", "And its colour?"]


def picture(seed: int, size=(56, 40)) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size[1], size[0], 3), generator=generator,
                                         dtype=torch.uint8).numpy())


def tgw_generate_reply_hf(question: str, original_question: str, state: dict, stopping_strings=None, is_chat=False):
    """What text-generation-webui 1dcde41d's `generate_reply_HF` hands `model.generate()` (see the module
    docstring), greedy, not streamed; yields the reply's new ids."""
    from modules.extensions import apply_extensions

    input_ids = encode(question, add_bos_token=state["add_bos_token"])
    question, input_ids, inputs_embeds = apply_extensions("tokenizer", state, question, input_ids, None)
    params = {"inputs": input_ids, "max_new_tokens": NEW_TOKENS, "do_sample": False, "use_cache": True,
              "eos_token_id": [shared.tokenizer.eos_token_id], "logits_processor": LogitsProcessorList([])}
    if inputs_embeds is not None:
        params["inputs_embeds"] = inputs_embeds
    apply_extensions("logits_processor", params["logits_processor"], input_ids)
    with torch.no_grad():
        output = shared.model.generate(**params)[0]
    yield output[len(input_ids[0]):].tolist()


@pytest.fixture
def tgw_host(host, family_folder, monkeypatch):
    """`load(family)`: the family loaded as text-generation-webui's loader does, the extension set up there."""
    def load(family: str, exact_features: bool = True):
        host.load(family_folder(family), argv=["--extensions", "multimodal"],
                  settings={"multimodal-add_all_images_to_prompt": True})
        from extensions.multimodal import script
        from extensions.multimodal.tgw import generation

        # text-generation-webui's Transformers loader: AutoModelForCausalLM, which the extension lets load
        # the full image-text class; no routes built by the host; its generate_reply_HF.
        shared.model = AutoModelForImageTextToText.from_pretrained(family_folder(family)).eval()
        monkeypatch.setattr(script.loaded_model, "host_builds_routes", lambda: False)
        monkeypatch.setattr(generation, "generate_reply_HF", tgw_generate_reply_hf)
        script.setup()
        if not exact_features:  # as at transformers 5.6 for the families it cannot take features of
            pipeline = script.served_model.embedder(script.params).pipeline
            monkeypatch.setattr(pipeline, "features_exact_here", lambda: False)
        return script
    return load


def conversation(pictures: list, replies: list[list[int]], tokenizer) -> list[dict]:
    """The chat so far, content as parts (pictures first), HF's way; earlier replies as decoded."""
    messages = []
    for turn, question in enumerate(QUESTIONS[:len(replies) + 1]):
        parts = [{"type": "image", "image": pictures[turn]}] if turn < len(pictures) else []
        messages.append({"role": "user", "content": parts + [{"type": "text", "text": question}]})
        if turn < len(replies):
            text = tokenizer.decode(replies[turn], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    return messages


def tagged_prompt(reference, messages: list[dict], image_text: str, script) -> str:
    """The template's text for `messages`, each image's text replaced by the picture's history tag."""
    text = hf_reference.chat_text(reference, messages)
    pictures = [part["image"] for message in messages for part in message["content"] if part["type"] == "image"]
    pieces = text.split(image_text)
    assert len(pieces) == len(pictures) + 1
    return "".join(piece + (script.image_to_history_tag(pictures[i]) if i < len(pictures) else "")
                   for i, piece in enumerate(pieces))


def hf_reply(model, reference, messages: list[dict]) -> list[int]:
    inputs = hf_reference.chat_inputs(reference, messages)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return output[0, inputs["input_ids"].shape[-1]:].tolist()


def run_chat(script, family_folder, family: str, pictures: list, caplog) -> tuple[list, list, list[int]]:
    """Two turns (a picture, then a text-only follow-up) through the hook, then the second regenerated
    (the kept cache holds that prompt and its reply: it must be cut back); (ours, HF's, reused per call)."""
    from modules.chat import new_state

    reference = hf_reference.load(family_folder(family))
    ours, theirs, reused = [], [], []
    for turn in (0, 1, 1):
        messages = conversation(pictures, ours[:turn], reference.tokenizer)
        prompt = tagged_prompt(reference, messages, TEMPLATE_IMAGE_TEXT[family], script)
        state = new_state(add_bos_token=False)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            ours.append(next(script.custom_generate_reply(prompt, prompt, state, [], is_chat=True)))
        found = re.findall(r"prefilled, (\d+) from the cache", caplog.text)
        reused.append(int(found[-1]) if found else None)
        theirs.append(hf_reply(shared.model, reference, messages))
    return ours, theirs, reused


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_the_fast_path_gives_hugging_faces_replies_and_prefills_only_what_the_cache_lacks(tgw_host, family_folder, family, caplog):
    script = tgw_host(family)
    assert hasattr(script, "custom_generate_reply") and not script.serving.processor_route(script.params)
    reference = hf_reference.load(family_folder(family))
    first = conversation([picture(1)], [], reference.tokenizer)
    assert hf_reply(shared.model, reference, first) != hf_reply(
        shared.model, reference, conversation([picture(2, (40, 64))], [], reference.tokenizer)), "the picture matters"
    ours, theirs, reused = run_chat(script, family_folder, family, [picture(1)], caplog)
    assert ours == theirs
    assert reused[0] == 0 and 0 < reused[1] < reused[2], reused  # only what the cache did not hold was prefilled


def test_the_processor_route_gives_hugging_faces_replies(tgw_host, family_folder, caplog):
    script = tgw_host("qwen2_5_vl", exact_features=False)
    assert script.serving.processor_route(script.params)
    ours, theirs, reused = run_chat(script, family_folder, "qwen2_5_vl", [picture(3)], caplog)
    assert ours == theirs
    assert reused == [None, None, None]  # the processor route keeps no cache: the tower runs inside generate



def test_the_processor_route_runs_the_processor_once_for_a_prompt_measured_then_generated(tgw_host, family_folder,
                                                                                           monkeypatch):
    """text-generation-webui measures the prompt (`custom_tokenized_length`), then hands it to the tokenizer
    hook: one processor run for both, counted at the pipeline; a changed prompt runs it again."""
    from modules.chat import new_state

    script = tgw_host("qwen2_5_vl", exact_features=False)
    pipeline = script.served_model.embedder(script.params).pipeline
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return type(pipeline).processor_inputs(pipeline, *args, **kwargs)

    monkeypatch.setattr(pipeline, "processor_inputs", counted)
    reference = hf_reference.load(family_folder("qwen2_5_vl"))
    prompt = tagged_prompt(reference, conversation([picture(5)], [], reference.tokenizer),
                           TEMPLATE_IMAGE_TEXT["qwen2_5_vl"], script)
    measured = script.custom_tokenized_length(prompt)
    state = new_state(add_bos_token=True)
    _, ids, _ = script.tokenizer_modifier(state, prompt, encode(prompt), None)
    assert measured == ids.shape[-1] and len(calls) == 1
    script.custom_tokenized_length(prompt + "more")
    assert len(calls) == 2
