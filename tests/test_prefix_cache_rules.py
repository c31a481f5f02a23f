"""One set of KV-prefix rules in both hosts, on real caches of tiny real models.

The rules are written twice (docs/ARCHITECTURE.md): this host's `modules/prefix_cache.py` and the
extension's `tgw/prefix_cache.py`, for text-generation-webui. Here both run the same chats, each turn
as their hosts run it: `take` a cache for the prompt's input embeddings, prefill what it does not
hold, decode the reply greedily, `keep` it. Every turn must reuse the same number of tokens in both
copies (the differential check), the number the rules promise (the table), and give the logits a
fresh prefill of the whole prompt gives (the oracle: a crop the cache cannot take shows here even
where both copies agree).

The cases: full attention; a sliding window not full; a full window recording its past, after a
crop and never cropped; a full window that does not record (a route's own cache); cross-attention
layers holding pictures, with and without a route; pictures in the prefix; a linear-attention layer
that `crop` cannot undo. Chats: turn 1 a prompt P of 10 rows; then P continued; then P's first 6 rows
and something else; then that same prompt again (a regenerated reply).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch
from transformers import DynamicCache

from extensions.multimodal.tgw import prefix_cache as tgw_rules
from modules import prefix_cache as host_rules

HIDDEN = 32
SMALL = dict(vocab_size=64, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)
RULES = {"host": host_rules, "tgw": tgw_rules}


def seeded(build):
    @functools.cache
    def built(*args):
        torch.manual_seed(0)
        return build(*args).eval()
    return built


@seeded
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(**SMALL, num_hidden_layers=2))


@seeded
def gemma3(window: int):
    """One sliding-window layer and one full one, as Gemma 3 interleaves them."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return Gemma3ForCausalLM(Gemma3TextConfig(**SMALL, num_hidden_layers=2, sliding_window=window,
                                              layer_types=["sliding_attention", "full_attention"],
                                              query_pre_attn_scalar=16))


@seeded
def mllama():
    """Mllama's language model: layer 1 attends to the pictures' states (`cross_attention_layers`)."""
    from transformers import MllamaForCausalLM, MllamaTextConfig
    return MllamaForCausalLM(MllamaTextConfig(**SMALL, num_hidden_layers=3, cross_attention_layers=[1]))


@seeded
def qwen3_next():
    """A linear-attention layer (recurrent state: `crop` cannot undo it) and a full one."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    return Qwen3NextForCausalLM(Qwen3NextConfig(**SMALL, num_hidden_layers=2, mlp_only_layers=[0, 1],
                                                layer_types=["linear_attention", "full_attention"],
                                                linear_num_key_heads=1, linear_num_value_heads=2,
                                                linear_key_head_dim=8, linear_value_head_dim=8))


def rows(seed: int, n: int) -> torch.Tensor:
    """`(n, hidden)` input embeddings standing for n prompt tokens (text or a picture's rows)."""
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


P, MORE, OTHER = rows(1, 10), rows(2, 5), rows(3, 3)
PICTURE_A, PICTURE_B = rows(4, 3), rows(5, 3)
VISION = rows(6, 5)[None]  # (1, vision tokens, hidden): Mllama's pictures' states
CONTINUED, SHORTER = torch.cat([P, MORE]), torch.cat([P[:6], OTHER])
# (prompt, reply tokens) per turn: a continuation, a shorter shared prefix, the same prompt again
CHAT = [(P, 3), (CONTINUED, 2), (SHORTER, 2), (SHORTER, 0)]


@dataclass
class Case:
    model: object
    chat: list
    reused: list[int]  # the tokens each turn takes from the cache, by the rules
    has_route: bool = True  # the prompt comes with a route that checks the cached pictures
    vision: torch.Tensor | None = None  # Mllama: the pictures' states, given to a prefill from scratch
    own_cache: bool = False  # turn 1's route brings its own cache, which records no past (as Mllama's does)


CASES = {
    "full attention": lambda: Case(llama(), CHAT, [0, 10, 6, 8]),
    "sliding window not full": lambda: Case(gemma3(32), CHAT, [0, 10, 6, 8]),
    # every crop trims a recording window to its last states: it continues, but never goes back
    "sliding window full, recording, cropped": lambda: Case(gemma3(4), CHAT, [0, 10, 0, 0]),
    # a reply of no tokens is never cropped off: the recorded past is whole, and any crop works
    "sliding window full, recording, never cropped": lambda: Case(gemma3(4), [(P, 0), (SHORTER, 0)], [0, 6]),
    "sliding window full, not recording": lambda: Case(gemma3(4), [(P, 2), (CONTINUED, 0)], [0, 0], own_cache=True),
    "sliding window not full, not recording": lambda: Case(gemma3(32), [(P, 2), (CONTINUED, 0)], [0, 10],
                                                           own_cache=True),
    "cross-attention, a route": lambda: Case(mllama(), CHAT, [0, 10, 6, 8], vision=VISION),
    "cross-attention, no route": lambda: Case(mllama(), CHAT, [0, 0, 0, 0], has_route=False, vision=VISION),
    "pictures in the prefix": lambda: Case(llama(), [
        (torch.cat([P[:3], PICTURE_A, P[3:]]), 2),
        (torch.cat([P[:3], PICTURE_B, P[3:]]), 2),  # another picture, same size: the prefix ends before it
        (torch.cat([P[:3], PICTURE_B, P[3:], MORE]), 0)], [0, 3, 13]),
    "linear attention": lambda: Case(qwen3_next(), CHAT[:2], [0, 0]),
}


def run_turn(rules: ModuleType, case: Case, prompt: torch.Tensor, reply_tokens: int, first: bool):
    """(tokens reused, the prompt's last logits) for one turn, the reply decoded and the cache kept."""
    model = case.model
    cache, reused = rules.take(model, prompt, case.has_route)
    if case.own_cache and first:
        cache, reused = DynamicCache(config=model.config), 0
    with torch.no_grad():
        vision = {"cross_attention_states": case.vision} if case.vision is not None and reused == 0 else {}
        logits = model(inputs_embeds=prompt[None, reused:], past_key_values=cache, use_cache=True, **vision).logits
        prompt_logits = logits = logits[0, -1]
        for _ in range(reply_tokens):
            logits = model(input_ids=logits.argmax().view(1, 1), past_key_values=cache, use_cache=True).logits[0, -1]
    rules.keep(model, prompt, cache)
    return reused, prompt_logits


def fresh_logits(case: Case, prompt: torch.Tensor) -> torch.Tensor:
    vision = {"cross_attention_states": case.vision} if case.vision is not None else {}
    with torch.no_grad():
        return case.model(inputs_embeds=prompt[None], use_cache=False, **vision).logits[0, -1]


@pytest.fixture
def clean():
    for rules in RULES.values():
        rules.clear()
    yield
    for rules in RULES.values():
        rules.clear()


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_copies_reuse_the_same_prefix_and_it_is_exact(name, clean):
    case = CASES[name]()
    runs = {}
    for label, rules in RULES.items():
        runs[label] = [run_turn(rules, case, prompt, reply, index == 0)
                       for index, (prompt, reply) in enumerate(case.chat)]
    reused = {label: [count for count, _ in turns] for label, turns in runs.items()}
    assert reused["host"] == reused["tgw"], f"{name}: the two copies disagree: {reused}"
    assert reused["host"] == case.reused, f"{name}: reused {reused['host']}, the rules say {case.reused}"
    for label, turns in runs.items():
        for (prompt, _), (count, logits) in zip(case.chat, turns):
            torch.testing.assert_close(logits, fresh_logits(case, prompt), atol=1e-5, rtol=1e-4,
                                       msg=lambda m: f"{name}, {label}, {count} tokens reused: {m}")


def rule_functions(rules: ModuleType) -> dict[str, inspect.Signature]:
    """The module's functions from `new_cache` on (the rules both copies share), by name."""
    functions = [(name, f) for name, f in vars(rules).items()
                 if inspect.isfunction(f) and f.__module__ == rules.__name__]
    functions.sort(key=lambda item: item[1].__code__.co_firstlineno)
    names = [name for name, _ in functions]
    return {name: inspect.signature(f) for name, f in functions[names.index("new_cache"):]}


def test_the_rules_have_the_same_names_and_signatures_in_both_copies():
    host, tgw = rule_functions(host_rules), rule_functions(tgw_rules)
    assert {"new_cache", "usable_length", "cut_reply", "shortest_crop", "holds_images"} <= set(host)
    assert host == tgw
