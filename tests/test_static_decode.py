"""Decoding with the static KV cache (`modules/static_decode.py`): token for token the eager dynamic path's
and Hugging Face's own `generate`, turn after turn, with the prefix kept between turns.

On a CPU transformers does not compile, so these run the static cache eagerly: what they check is
the cache itself (every layer full-length, cropped by its write position, slots past it masked) and
its reuse across turns, on tiny real checkpoints of the families it covers (llava-hf, LLaVA-NeXT,
LLaVA-OneVision, Qwen2.5-VL's 3-D positions, Gemma 3's sliding window, here 8 tokens so that every
prompt overflows it). Each chat: a picture, a text follow-up, a new picture, then the third turn
asked again (its cache cropped back into the second turn), then a new chat that shares only the
template's first tokens. A family it does not cover keeps the dynamic cache and says so once.
The same for text-generation-webui's route (tgw/static_decode.py, tgw/generation.py), and the two
copies of the rules agree.
"""
from __future__ import annotations

import functools
import logging

import pytest

from fixtures import host_helpers, vlm_families
from modules import chat, prefix_cache, shared, static_decode
from tests.test_tgw_route import picture, run_chat, tgw_host  # noqa: F401 (tgw_host: a fixture)
from tests.test_vlm_families_host import NEW_TOKENS, hf_reply, png

FAMILIES = {"llava": vlm_families.build_llava, "llava_next": vlm_families.build_llava_next,
            "llava_onevision": vlm_families.build_llava_onevision, "qwen2_5_vl": vlm_families.build_qwen2_5_vl,
            "gemma3": functools.partial(vlm_families.build_gemma3, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"])}
# (text, picture size and seed or None)
TURNS = [("What is in the picture?", (64, 48, 31)), ("And the colours?", None), ("And this one?", (48, 64, 32))]
CONTEXT = 512  # truncation_length: the static cache's slots (whole blocks of static_decode.BLOCK)


def turn(text: str, picture, history: dict, static: bool) -> tuple[str, dict]:
    state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, history=history, static_cache=static,
                                      truncation_length=CONTEXT, message_images=[png(*picture)] if picture else None)
    latest = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
    return latest["internal"][-1][1], latest


def chat_replies(static: bool) -> tuple[list[str], list[int]]:
    """The replies of the scenario above, and the tokens the prefix cache gave each turn."""
    prefix_cache.clear()
    replies, history = [], chat.new_history()
    with host_helpers.reused_tokens() as reused:
        for text, picture in TURNS:
            reply, history = turn(text, picture, history, static)
            replies.append(reply)
        earlier = {key: turns[:-1] for key, turns in history.items()}
        replies.append(turn(TURNS[-1][0], TURNS[-1][1], earlier, static)[0])  # asked again
        replies.append(turn("What is in the picture?", (40, 40, 33), chat.new_history(), static)[0])  # a new chat
        return replies, list(reused)


def hf_replies() -> list[str]:
    turns, replies = [], []
    for text, picture in TURNS:
        turns.append((text, [png(*picture)] if picture else [], None))
        replies.append(hf_reply(turns))
        turns[-1] = (text, turns[-1][1], replies[-1])
    replies.append(replies[-1])
    replies.append(hf_reply([("What is in the picture?", [png(40, 40, 33)], None)]))
    return replies


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_static_cache_decodes_as_the_dynamic_one_and_hugging_face(host, tmp_path, family):
    host.load(FAMILIES[family](tmp_path / family), ["multimodal"])
    dynamic, _ = chat_replies(static=False)
    static, reused = chat_replies(static=True)
    assert isinstance(prefix_cache._kept.cache, static_decode.WritePositionCache), "the static cache was not kept"
    # Gemma 3 prefills a turn with a new picture whole (static_decode.usable_prefix); the others keep its prefix.
    kept = [1, 3] if family == "gemma3" else [1, 2, 3]
    assert all(reused[i] > 0 for i in kept), f"a turn reused no prefix: {reused}"
    assert static == dynamic
    assert static == hf_replies()


def test_a_cache_kept_for_the_other_kind_of_decoding_is_not_reused(host, family_folder):
    """The setting changed between turns: the kept cache of the other kind is dropped, the turn is right."""
    host.load(family_folder("llava"), ["multimodal"])
    prefix_cache.clear()
    history, turns = chat.new_history(), []
    for (text, picture), static in zip(TURNS, [True, False, True]):
        reply, history = turn(text, picture, history, static)
        kept = prefix_cache._kept.cache
        assert isinstance(kept, static_decode.WritePositionCache) == static
        turns.append((text, [png(*picture)] if picture else [], None))
        assert reply == hf_reply(turns)
        turns[-1] = (text, turns[-1][1], reply)


def test_a_family_it_does_not_cover_keeps_the_dynamic_cache(host, family_folder, caplog):
    host.load(family_folder("idefics3"), ["multimodal"])
    static_decode._told.discard("idefics3")
    with caplog.at_level(logging.INFO):
        first, history = turn(*TURNS[0], chat.new_history(), static=True)
        turn(*TURNS[1], history, static=True)
    assert not isinstance(prefix_cache._kept.cache, static_decode.WritePositionCache)
    assert [r.message for r in caplog.records if "keeps the dynamic KV cache" in r.message] == \
        [f"Static cache: idefics3 keeps the dynamic KV cache (static decoding covers "
         f"{', '.join(sorted(static_decode.FAMILIES))})"]
    assert first == hf_reply([(TURNS[0][0], [png(*TURNS[0][1])], None)])


@pytest.mark.parametrize("family", ["gemma3", "llava", "qwen2_5_vl"])
def test_text_generation_webuis_route_decodes_with_the_static_cache_as_hugging_face(tgw_host, family_folder, family,
                                                                                     caplog):
    """The extension's own generation (tgw/generation.py, as tests/test_tgw_route.py runs it) with its
    `static_cache` param: a picture, a follow-up, the follow-up regenerated; replies token for token HF's."""
    from extensions.multimodal.tgw import prefix_cache as tgw_prefix_cache
    from extensions.multimodal.tgw import static_decode as tgw_static_decode

    script = tgw_host(family)
    script.params["static_cache"] = True
    ours, theirs, reused = run_chat(script, family_folder, family, [picture(1)], caplog)
    assert isinstance(tgw_prefix_cache._kept.cache, tgw_static_decode.WritePositionCache)
    assert ours == theirs
    assert reused[0] == 0 and 0 < reused[1] < reused[2], reused


def test_the_two_copies_agree(host, family_folder):
    """modules/static_decode.py and its text-generation-webui twin: the same families, rules and sizes."""
    from extensions.multimodal.tgw import static_decode as twin

    host.load(family_folder("llava"), ["multimodal"])

    # DEFAULT_ON_CUDA differs on purpose: the host's was measured on a GPU, the twin's (text-generation-
    # webui's generating threads, its compiler switch) was not.
    for name in ("FAMILIES", "MASK_FROM_TOKEN_TYPES", "MIN_SLOTS", "BLOCK"):
        assert getattr(twin, name) == getattr(static_decode, name), name
    for context, prompt, new in [(512, 100, 8), (512, 600, 8), (2048, 2047, 512), (4096, 100, 512),
                                 (131072, 3000, 512), (131072, 5000, 512), (131072, 131000, 512)]:
        state = {"static_cache": True, "truncation_length": context, "max_new_tokens": new}
        assert static_decode.cache_length(state, prompt) == twin.cache_length(shared.model, True, context, prompt, new)


def test_a_long_context_does_not_size_the_cache():
    """Gemma 3 and Qwen2.5-VL have 128K-token contexts: the slots follow the chat, doubling as it grows."""
    assert static_decode.slots(131072, 3000) == 4096
    assert static_decode.slots(131072, 5000) == 8192
    assert static_decode.slots(4096, 100) == 4096
    assert static_decode.slots(2048, 100) == 2048  # never more than the context, in whole blocks
    assert static_decode.slots(512, 600) == 768  # nor less than the prompt and the reply need


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_a_chat_that_outgrows_its_static_cache_keeps_its_prefix(host, family_folder, monkeypatch, family):
    """Slots from 64, doubled: each turn needs more than the last had, so its cache is lengthened with
    the kept rows (Gemma 3's sliding layers too), and every reply is still Hugging Face's."""
    monkeypatch.setattr(static_decode, "MIN_SLOTS", 64)
    host.load(family_folder(family), ["multimodal"])
    prefix_cache.clear()
    history, turns, lengths = chat.new_history(), [], []
    with host_helpers.reused_tokens() as reused:
        for text, picture in TURNS[:2] + [("Tell me more about the colours, the shapes and the light. " * 4, None)]:
            reply, history = turn(text, picture, history, static=True)
            lengths.append(prefix_cache._kept.cache.length)
            turns.append((text, [png(*picture)] if picture else [], None))
            assert reply == hf_reply(turns), (family, len(turns))
            turns[-1] = (text, turns[-1][1], reply)
    assert lengths == sorted(set(lengths)), f"each turn's cache is longer: {lengths}"
    assert all(count > 0 for count in reused[1:]), f"a lengthened cache lost its prefix: {reused}"


@pytest.mark.parametrize("twin", ["modules.static_decode", "extensions.multimodal.tgw.static_decode"])
def test_a_lengthened_cache_holds_the_rows_and_writes_after_them(twin):
    import importlib

    import torch

    module = importlib.import_module(twin)
    torch.manual_seed(0)
    cache = module.WritePositionCache(2, 8)
    keys, values = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    for layer in range(2):
        cache.update(keys, values, layer)
    cache.crop(-1)  # the kept prefix: 4 rows
    longer = module.lengthened(cache, 16)
    assert longer.length == 16 and module.fits(longer, 16) and module.lengthened(longer, 16) is longer
    step = torch.randn(1, 2, 1, 4)
    for layer in range(2):
        k, v = longer.update(step, step, layer)
        assert torch.equal(k[:, :, :4], keys[:, :, :4]) and torch.equal(v[:, :, :4], values[:, :, :4])
        assert torch.equal(k[:, :, 4:5], step) and not k[:, :, 5:].any()
    assert int(longer.get_seq_length()) == 5


def test_each_cache_length_is_told_once_and_whether_the_reply_waits_for_a_compile(host, family_folder, caplog,
                                                                                   monkeypatch):
    """On a GPU the first reply at a new length waits tens of seconds for transformers' compile: the log
    says so where transformers' own rule compiles (here made to by its `_compile_all_devices`), and not
    where the compiler is off for the thread (text-generation-webui's loader), nor on a CPU."""
    import torch._dynamo
    from transformers import CompileConfig

    from extensions.multimodal.tgw import static_decode as twin

    host.load(family_folder("llava"), ["multimodal"])
    lengths = {"host": lambda prompt: static_decode.cache_length(
                   {"static_cache": True, "truncation_length": 131072, "max_new_tokens": 8}, prompt),
               "tgw": lambda prompt: twin.cache_length(shared.model, True, 131072, prompt, 8)}

    def told(copy: str, prompts: list[int]) -> list[str]:
        for module in (static_decode, twin):
            monkeypatch.setattr(module, "_lengths_told", set())
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for prompt in prompts:
                lengths[copy](prompt)
        return [r.message for r in caplog.records if r.message.startswith("Static cache: llava decodes")]

    waits = " (transformers compiles the decoding step at the first two lengths: such a reply waits for it)"
    compiling = CompileConfig()
    compiling._compile_all_devices = True
    for copy in lengths:
        assert told(copy, [100, 200, 5000, 300]) == ["Static cache: llava decodes with 4096 slots",
                                                     "Static cache: llava decodes with 8192 slots"], copy
        monkeypatch.setattr(shared.model.generation_config, "compile_config", compiling)
        assert told(copy, [100]) == [f"Static cache: llava decodes with 4096 slots{waits}"], copy
        with torch._dynamo.config.patch(disable=True):
            assert told(copy, [100]) == ["Static cache: llava decodes with 4096 slots"], copy
        monkeypatch.setattr(shared.model.generation_config, "compile_config", None)
