"""The static cache's decode step as transformers compiles it: one graph, with no break, for every turn.

On CUDA transformers compiles each decoding step's forward when the cache is static
(`modules/static_decode.py`); CUDA graphs then replay it, and each graph break would leave Python
between its pieces, each new graph a compile of tens of seconds. On a CPU it does not compile unless
its compile config says `_compile_all_devices`: these tests set that, with the "eager" backend
(TorchDynamo traces and guards as on a GPU; no C++ compiler needed), and run a chat of each family the
static cache covers through the host: a picture, a text follow-up, a new picture. The prefix kept
between turns by moving the cache's write position must not make another graph, and the replies
are still Hugging Face's.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import CompileConfig

from fixtures import host_helpers
from modules import chat, prefix_cache, shared, static_decode
from tests.test_static_decode import FAMILIES, TURNS, turn
from tests.test_vlm_families_host import hf_reply, png

CHAT = TURNS + [("And this last one?", (56, 40, 34))]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing, and leaves no compiled code behind."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def compiled_everywhere() -> None:
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True  # transformers' own switch for compiling off CUDA
    shared.model.generation_config.compile_config = config


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_turn_decodes_through_one_graph_without_breaks(host, tmp_path, family):
    assert family in static_decode.FAMILIES
    host.load(FAMILIES[family](tmp_path / family), ["multimodal"])
    compiled_everywhere()
    prefix_cache.clear()
    history, turns = chat.new_history(), []
    for text, picture in CHAT:
        reply, history = turn(text, picture, history, static=True)
        turns.append((text, [png(*picture)] if picture else [], None))
        assert reply == hf_reply(turns), (family, len(turns))
        turns[-1] = (text, turns[-1][1], reply)
    assert isinstance(prefix_cache._kept.cache, static_decode.WritePositionCache)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_a_graph_break_in_the_step_is_seen(host, family_folder, monkeypatch):
    """The counters above do see a break: one put into the cache's update."""
    from transformers.cache_utils import StaticLayer

    update = StaticLayer.update

    def broken(self, *args, **kwargs):
        torch._dynamo.graph_break()
        return update(self, *args, **kwargs)

    monkeypatch.setattr(StaticLayer, "update", broken)
    host.load(family_folder("llava"), ["multimodal"])
    compiled_everywhere()
    turn(*TURNS[0], chat.new_history(), static=True)
    assert counters["graph_break"]


def test_a_third_cache_length_compiles_nothing_more(host, family_folder):
    """Not one compile per cache length: the first length's graph is static; the second is compiled
    again with the length as a symbol (torch's automatic dynamic shapes, under transformers' default
    compile config), and that graph serves every later length. Three chats need 512, 768 and 1024
    slots (their contexts)."""
    host.load(family_folder("llava"), ["multimodal"])
    compiled_everywhere()
    graphs = []
    for context in (512, 768, 1024):
        prefix_cache.clear()
        state = host_helpers.greedy_state(max_new_tokens=4, static_cache=True, truncation_length=context)
        list(chat.generate_chat_reply("Hello there.", state, loading_message=False))
        assert prefix_cache._kept.cache.length == context
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 2, 2], dict(counters["stats"])


def test_compiled_at_start_up_the_first_replies_compile_nothing(host, family_folder, monkeypatch):
    """server.py's warm-up (modules/static_warm_up.py) with `--static-cache` where transformers compiles:
    the step is compiled before serving, and a chat's turns after it, a picture then a follow-up, run
    that graph without compiling again, and give Hugging Face's replies. Where transformers does not
    compile (a CPU, by its own rule) the warm-up does nothing."""
    from modules import static_warm_up
    from tests.test_vlm_families_host import NEW_TOKENS

    host.load(family_folder("llava"), ["multimodal"])
    monkeypatch.setattr(shared.args, "static_cache", True)
    static_warm_up.compile_static_decode()
    assert counters["stats"]["unique_graphs"] == 0 and prefix_cache._kept is None
    compiled_everywhere()
    static_warm_up.compile_static_decode()
    assert counters["stats"]["unique_graphs"] == 1 and prefix_cache._kept is None
    history, turns = chat.new_history(), []
    for text, picture in TURNS[:2]:
        images = [png(*picture)] if picture else None
        state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, history=history, message_images=images)
        history = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
        turns.append((text, images or [], None))
        assert history["internal"][-1][1] == hf_reply(turns)
        turns[-1] = (text, turns[-1][1], history["internal"][-1][1])
    assert isinstance(prefix_cache._kept.cache, static_decode.WritePositionCache)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_a_step_that_cannot_compile_leaves_the_dynamic_cache_and_the_replies(host, family_folder, monkeypatch, caplog):
    """Where the compiler fails (Windows has no working Triton, say), the start-up warm-up says why and the
    host serves with the dynamic cache, rather than failing every reply."""
    from modules import static_warm_up
    from tests.test_vlm_families_host import NEW_TOKENS

    def no_triton(graph, example_inputs):
        raise RuntimeError("Cannot find a working triton installation")

    host.load(family_folder("llava"), ["multimodal"])
    monkeypatch.setattr(shared.args, "static_cache", True)
    config = CompileConfig(backend=no_triton, mode=None)
    config._compile_all_devices = True
    shared.model.generation_config.compile_config = config
    static_warm_up.compile_static_decode()
    assert shared.settings["static_cache"] is False and prefix_cache._kept is None
    assert "did not compile" in caplog.text and "triton" in caplog.text
    text, picture = TURNS[0]
    state = host_helpers.greedy_state(max_new_tokens=NEW_TOKENS, message_images=[png(*picture)])
    history = list(chat.generate_chat_reply(text, state, loading_message=False))[-1]
    assert history["internal"][-1][1] == hf_reply([(text, [png(*picture)], None)])
    assert not isinstance(prefix_cache._kept.cache, static_decode.WritePositionCache)
