"""Every image-text family through the host, as a user's folder: token-identical to Hugging Face.

Each family's tiny checkpoint (fixtures/vlm_families.py) is loaded as `python server.py --model DIR`
would load it (`host_helpers.load`: the host's model loader, the multimodal extension picking the
`transformers` pipeline by itself). A chat turn goes through the host's own chat function with the
pictures sent as PNG bytes (`state['message_images']`, what the UI's upload and the API hand over),
or through `/v1/chat/completions`. The reference is `model.generate(**inputs)` with the inputs of
the checkpoint's own processor for the same conversation, the pictures in its image parts
(`fixtures/hf_reference.py`: `apply_chat_template(tokenize=True)`, transformers' public API only), with
the image token (`config.image_token_id`) suppressed as the host's placeholder ban does (a random tiny
model may well pick it). So LLaVA-OneVision's pictures are laid out as one of several once the
conversation holds two (base tile and newline, no anyres tiles), as Hugging Face does.
Scenarios: one picture; two pictures of different sizes in one message; three turns with a new
picture on turn 3, prefix cache on and off; the same three turns through the API. Each turn first
shows that the picture matters (another picture changes the reference reply).
"""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from modules import chat, shared
from fixtures import api_helpers, hf_reference, host_helpers, vlm_families
from fixtures.vlm_families import png

FAMILIES = list(vlm_families.FAMILIES)
NEW_TOKENS = 8


def hf_reply(history: list[tuple[str, list[bytes], str | None]], model=None) -> str:
    """Hugging Face's greedy reply to the last user turn of `history` [(text, pictures, reply or None)],
    from `model` (default: the served one)."""
    return hf_generate(history, model)[1]


def hf_generate(history: list[tuple[str, list[bytes], str | None]], model=None,
                images_kwargs: dict | None = None) -> tuple[torch.Tensor, str]:
    """Hugging Face's prompt ids `(n,)` and greedy reply for `history` (see `hf_reply`); `images_kwargs`:
    the image processor's per-call settings."""
    model = model if model is not None else shared.model
    processor = hf_reference.load(shared.model.config._name_or_path)  # the served folder
    messages = []
    for text, pictures, reply in history:
        images = [{"type": "image", "image": Image.open(io.BytesIO(p)).convert("RGB")} for p in pictures]
        messages.append({"role": "user", "content": images + [{"type": "text", "text": text}]})
        if reply is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
    has_pictures = any(pictures for _, pictures, _ in history)
    inputs = hf_reference.chat_inputs(processor, messages, **(images_kwargs or {}) if has_pictures else {})
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                suppress_tokens=[model.config.image_token_id])
    reply = processor.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return inputs["input_ids"][0], reply.lstrip(" ")


def host_reply(text: str, pictures: list[bytes], history: dict, prefix_cache: bool) -> tuple[str, dict]:
    state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, history=history, prefix_cache=prefix_cache,
                                      message_images=list(pictures) or None)
    latest = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
    return latest["internal"][-1][1], latest


def check(history, ours: str) -> None:
    """The reference for `history`, shown to depend on the last turn's pictures, equals our reply."""
    expected = hf_reply(history)
    text, pictures, _ = history[-1]
    # A tiny random model ignores some pictures: one of a few others must change the reference.
    others = [[png(*Image.open(io.BytesIO(p)).size, seed=100 + k) for p in pictures] for k in range(4)]
    assert any(hf_reply(history[:-1] + [(text, other, None)]) != expected for other in others), \
        "no other picture changes the reference reply"
    assert ours == expected


@pytest.fixture
def loaded(host, family_folder, request):
    host.load(family_folder(request.param), ["multimodal"])
    from extensions.multimodal import script

    assert script.served_model.embedder(script.params).pipeline.name() in ("transformers", "llava-hf")
    return request.param


@pytest.mark.parametrize("loaded", FAMILIES, indirect=True)
def test_one_picture(loaded):
    picture = png(64, 48, 1)
    reply, _ = host_reply("What is in the picture?", [picture], chat.new_history(), prefix_cache=False)
    check([("What is in the picture?", [picture], None)], reply)


@pytest.mark.parametrize("loaded", FAMILIES, indirect=True)
def test_two_pictures_of_different_sizes(loaded):
    first, second = png(64, 48, 3), png(40, 72, 4)
    reply, _ = host_reply("Which image is larger?", [first, second], chat.new_history(), prefix_cache=False)
    check([("Which image is larger?", [first, second], None)], reply)


TURNS = [("What is in the picture?", (64, 48, 6)), ("And the colours?", None), ("And this one?", (48, 64, 7))]


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize("loaded", FAMILIES, indirect=True)
def test_three_turns_with_a_new_picture_on_turn_three(loaded, prefix_cache):
    history, turns = chat.new_history(), []
    for text, size in TURNS:
        pictures = [png(*size)] if size else []
        reply, history = host_reply(text, pictures, history, prefix_cache)
        turns.append((text, pictures, None))
        if size:
            check(turns, reply)
        else:
            assert reply == hf_reply(turns)
        turns[-1] = (text, pictures, reply)


@pytest.mark.parametrize("name", FAMILIES)
def test_three_turns_through_the_api(family_folder, name):
    three_turns_through_the_api(family_folder(name))


def three_turns_through_the_api(folder) -> None:
    """`TURNS` through `/v1/chat/completions` on one server, each reply equal to Hugging Face's; turns
    with a picture also show that another picture changes the reference."""
    with api_helpers.serving(folder, ["multimodal"]) as api:
        messages, turns = [], []
        for text, size in TURNS:
            api_turn(api, messages, turns, text, [png(*size)] if size else [])


def api_turn(api, messages: list, turns: list, text: str, pictures: list[bytes]) -> str:
    """One more user turn of a chat through `/v1/chat/completions`; its reply, checked against Hugging
    Face's (turns with pictures also show another picture changes it). `messages` (the API's) and
    `turns` (`hf_reply`'s) are the chat so far; both get the turn and its reply."""
    content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(p)}} for p in pictures]
    messages.append({"role": "user", "content": content + [{"type": "text", "text": text}]})
    turns.append((text, pictures, None))
    reply = api.client().chat.completions.create(model="any", messages=messages, max_tokens=NEW_TOKENS,
                                                 temperature=0).choices[0].message.content
    if pictures:
        check(turns, reply)
    else:
        assert reply == hf_reply(turns), text
    messages.append({"role": "assistant", "content": reply})
    turns[-1] = (text, pictures, reply)
    return reply


@pytest.mark.parametrize("loaded", ["qwen2_5_vl", "gemma3", "llava_onevision"], indirect=True)
def test_two_pictures_of_one_size_never_share_a_cached_prefix(loaded):
    """The prefix cache compares embeddings, which hold each picture's features: same ids, other picture, no reuse."""
    first, second = png(64, 48, 8), png(64, 48, 9)
    for picture in (first, second):
        reply, _ = host_reply("What is in the picture?", [picture], chat.new_history(), prefix_cache=True)
        assert reply == hf_reply([("What is in the picture?", [picture], None)])
    assert hf_reply([("What is in the picture?", [first], None)]) != hf_reply([("What is in the picture?", [second], None)])


@pytest.mark.parametrize("loaded", ["qwen2_5_vl", "gemma3", "idefics3"], indirect=True)
def test_an_old_turn_that_does_not_fit_goes_whole_with_its_picture(loaded):
    """Prompt lengths count every picture's real layout, so the oldest turn is dropped whole."""
    old, new = png(64, 48, 10), png(48, 64, 11)
    history = host_reply("What is in the picture?", [old], chat.new_history(), prefix_cache=False)[1]
    state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, history=history, message_images=[new])
    full = chat.generate_chat_prompt(chat.user_message("And this one?", dict(state))[0], state, history=history)
    from modules.text_generation import get_encoded_length

    state["truncation_length"] = get_encoded_length(full) - 1 + NEW_TOKENS  # one token short: turn 1 must go
    latest = list(chat.generate_chat_reply("And this one?", state, loading_message=False))[-1]
    assert state["generation_stats"]["prompt_tokens"] < get_encoded_length(full)
    assert latest["internal"][-1][1] == hf_reply([("And this one?", [new], None)])


@pytest.mark.parametrize("loaded", ["llava_onevision"], indirect=True)
def test_a_picture_that_truncation_leaves_alone_is_laid_out_alone(loaded):
    """Two pictures are laid out as several; when truncation drops the first, the second is laid out
    again as a lone picture, as Hugging Face would for that prompt. A lone LLaVA-OneVision picture
    takes more tokens than two as several here, so it no longer fits either and goes too."""
    from extensions.multimodal import script
    from extensions.multimodal.core.image_codec import store_bytes
    from extensions.multimodal.core.pad_safe_ids import image_row_id

    embedder, first, second = script.served_model.embedder(script.params), png(64, 48, 12), png(48, 64, 13)
    tags = [store_bytes(picture).tag for picture in (first, second)]
    prompt = f"Look: {tags[0]} and {tags[1]} Which one?"
    both, second_alone = embedder.len_in_tokens(prompt), embedder.len_in_tokens(f" and {tags[1]} Which one?")
    assert second_alone > both, "this checks nothing: the lone layout is not the longer one"
    state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, truncation_length=both - 10 + NEW_TOKENS)
    result = embedder.forward(prompt, state)
    assert result.images == 0 and int((result.input_ids == image_row_id(embedder.pipeline)).sum()) == 0
