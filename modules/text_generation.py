"""Tokenizing and generating, with text-generation-webui's signatures.

- `encode` / `decode`: text <-> token ids (BOS handling, truncation keeps the last tokens).
- `get_encoded_length`: prompt length, through an extension's `custom_tokenized_length` when one exists.
- `generate_reply(question, state, ...)`: a generator of the cumulative reply (with the local model,
  one generation at a time behind `shared.generation_lock`; with a remote engine, side by side), cut
  at the stopping strings and at the stop button (`stop_requested`). As in
  text-generation-webui, an extension's `custom_generate_reply` (looked up on every reply) replaces
  the host's own generation, `generate_reply_HF`, which it may call in turn.
- `generate_reply_HF`: with a remote engine (`shared.engine`), `remote_generation.remote_replies`.
  With the local model, before generating it calls the `tokenizer` hook; when that returns
  `inputs_embeds`, the model generates from those embeddings with an all-ones attention mask.
  The loaded batch-level logits processors (`shared.logits_processors`) run first on each step's
  logits, with `state['logits_processor_args']` as the request's `extra_args`; then the processors
  extensions add through `logits_processor_modifier`. Decoding is the state's alone
  (`sampling_params`): each sampler and penalty is the state's value or off, as text-generation-webui
  passes them, never the checkpoint's generation_config.json.
This module knows nothing about chat history. Of images it knows only that an extension may name a
tag pattern (`image_tag_pattern`) whose tags it leaves out of the plain ids (`text_for_plain_ids`).
"""
from __future__ import annotations

import ast
import copy
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator

import torch
import transformers
from transformers import LogitsProcessor as HFLogitsProcessor
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from modules import model_inputs, picture_stand_ins, prefix_cache, shared, static_decode
from modules.extensions import apply_extensions, apply_state_modifiers, iterator
from modules.logging_colors import logger
from modules.logits_processors import RequestParams
from modules.models import model_device
from modules.remote_generation import remote_replies
from modules.reply_text import ReplyText


def encode(prompt: str, add_special_tokens: bool = True, add_bos_token: bool = True,
           truncation_length: int | None = None) -> torch.LongTensor:
    """Token ids `[1, n]` on the model's device."""
    if shared.tokenizer is None:
        raise ValueError("No tokenizer is loaded")
    ids = shared.tokenizer.encode(str(prompt), return_tensors="pt", add_special_tokens=add_special_tokens)
    ids = fix_bos(ids, add_special_tokens and add_bos_token)
    if truncation_length is not None and truncation_length > 0:
        ids = ids[:, -truncation_length:]
    if shared.model is not None:
        ids = ids.to(model_device())
    return ids


def fix_bos(ids: torch.Tensor, want_bos: bool) -> torch.Tensor:
    """text-generation-webui's rule: a missing BOS added when `want_bos`; never two at the start (a
    template that writes the BOS, then a tokenizer that adds one)."""
    bos = getattr(shared.tokenizer, "bos_token_id", None)
    if bos is None:
        return ids
    if want_bos and (ids.shape[1] == 0 or ids[0, 0] != bos):
        ids = torch.cat([torch.tensor([[bos]], dtype=ids.dtype), ids], dim=1)
    while ids.shape[1] > 1 and ids[0, 0] == bos and ids[0, 1] == bos:
        ids = ids[:, 1:]
    return ids


def decode(output_ids, skip_special_tokens: bool = True) -> str:
    if shared.tokenizer is None:
        raise ValueError("No tokenizer is loaded")
    return shared.tokenizer.decode(output_ids, skip_special_tokens=skip_special_tokens)


def get_encoded_length(prompt: str) -> int:
    length_after_extensions = apply_extensions("tokenized_length", prompt)
    if length_after_extensions is not None:
        return length_after_extensions
    return len(encode(prompt)[0])


def get_max_prompt_length(state: dict) -> int:
    return state["truncation_length"] - state["max_new_tokens"]


def stop_everything_event() -> None:
    shared.stop_everything = True


def stop_requested(state: dict) -> bool:
    """Whether the reply being generated for `state` should stop: its own stop (`state[shared.STOP_EVENT]`,
    the session's Stop button), or everything's."""
    event = state.get(shared.STOP_EVENT)
    return shared.stop_everything or (event is not None and event.is_set())


def get_custom_stopping_strings(state: dict) -> list[str]:
    """`custom_stopping_strings` is text like `"\\nYou:", "END"` (text-generation-webui's format)."""
    raw = state.get("custom_stopping_strings") or ""
    if isinstance(raw, (list, tuple)):
        return [str(s) for s in raw if s]
    raw = raw.strip()
    if not raw:
        return []
    try:
        parsed = ast.literal_eval(f"[{raw}]")
    except (ValueError, SyntaxError):
        return [raw]
    return [str(s) for s in parsed if s]


class TokenQueue(BaseStreamer):
    """Hands each step's generated token ids from `model.generate` to the consuming thread.

    A `queue.SimpleQueue` (C code: one lock, no Python-level Condition) rather than a `queue.Queue`,
    whose put takes a mutex the consumer holds while it wakes, so the generating thread waited on the
    consumer, and on the GIL, once a token."""

    def __init__(self, events: queue.SimpleQueue, on_tokens: Callable[[list[int]], None] | None = None):
        self.events = events
        self.on_tokens = on_tokens  # also handed each step's tokens (the batch-level processors' bridge)
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() first passes the prompt ids (empty for an embeddings prompt)
            self.prompt_seen = True
            return
        tokens = value.reshape(-1).tolist()  # generate() hands them already on the host
        if self.on_tokens is not None:
            self.on_tokens(tokens)
        self.events.put(tokens)

    def end(self) -> None:
        """The producer signals the end itself, after the KV cache is kept."""


class StopOnEvent(StoppingCriteria):
    def __init__(self, event: threading.Event, state: dict):
        self.event = event
        self.state = state
        self.go: torch.Tensor | None = None  # "do not stop", made once: no new tensor (and kernel) per step

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        if self.event.is_set() or stop_requested(self.state):
            return torch.ones((input_ids.shape[0],), dtype=torch.bool, device=input_ids.device)
        if self.go is None or self.go.shape[0] != input_ids.shape[0] or self.go.device != input_ids.device:
            self.go = torch.zeros((input_ids.shape[0],), dtype=torch.bool, device=input_ids.device)
        return self.go


def set_seed(seed: int) -> int:
    """Seeds torch with any seed it takes (64 bits, as text-generation-webui and OpenAI clients send),
    and Python's and NumPy's generators, which take 32, with the seed modulo 2**32."""
    if seed is None or int(seed) == -1:
        seed = random.randint(1, 2**31)
    seed = int(seed)
    transformers.set_seed(seed % 2**32)
    if seed != seed % 2**32:
        torch.manual_seed(seed)  # every device's generator, as transformers' set_seed does
    return seed


# A positive temperature below this samples at it, as vLLM does: logits divided by 1e-38 overflow float32.
MIN_TEMPERATURE = 1e-2


def is_greedy(state: dict) -> bool:
    return not state.get("do_sample", True) or float(state.get("temperature", 1.0)) == 0


def sampling_temperature(state: dict) -> float:
    return max(float(state.get("temperature", 1.0)), MIN_TEMPERATURE)


# Hugging Face's samplers and penalties that the state has no key for, at the values that turn them
# off: `generate()` takes any it is not given from the checkpoint's generation_config.json
# (text-generation-webui passes each from its own state).
SAMPLERS_OFF: dict[str, Any] = {"min_p": None, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0,
                                "eta_cutoff": 0.0}
PENALTIES_OFF: dict[str, Any] = {"encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0}


def sampling_params(state: dict) -> dict[str, Any]:
    """`generate()`'s decoding arguments, as text-generation-webui passes them: the state's value of
    every sampler and penalty it holds, even a neutral one (repetition_penalty 1.0), and "off" for the
    rest, so a checkpoint's own generation_config.json (Qwen's repetition_penalty 1.05) never applies."""
    params: dict[str, Any] = {"max_new_tokens": int(state["max_new_tokens"]),
                              "repetition_penalty": float(state["repetition_penalty"]), **PENALTIES_OFF}
    if is_greedy(state):
        # Greedy decoding runs no sampler: each is unset, which also keeps transformers from warning
        # that the state's temperature and top_p are ignored.
        params.update(do_sample=False, temperature=None, top_p=None, top_k=None, **dict.fromkeys(SAMPLERS_OFF))
    else:
        params.update(do_sample=True, temperature=sampling_temperature(state), top_p=float(state["top_p"]),
                      top_k=int(state.get("top_k") or 0), **SAMPLERS_OFF)
    eos = shared.tokenizer.eos_token_id
    pad = shared.tokenizer.pad_token_id
    params["pad_token_id"] = pad if pad is not None else eos
    if state.get("ban_eos_token") and eos is not None:
        params["suppress_tokens"] = [eos]
    return params


def request_params(state: dict) -> RequestParams:
    """What the batch-level logits processors learn about this request."""
    args = state.get("logits_processor_args")
    if args is not None and not isinstance(args, dict):
        raise ValueError(f"logits_processor_args must be a mapping of argument names to values, "
                         f"got {type(args).__name__}: {args!r:.80}")
    greedy = is_greedy(state)
    return RequestParams(
        extra_args=copy.deepcopy(args) if args else None,  # a processor may keep or change its copy
        greedy=greedy, temperature=0.0 if greedy else sampling_temperature(state),
        top_p=float(state.get("top_p") or 1.0), top_k=int(state.get("top_k") or 0),
        max_new_tokens=int(state["max_new_tokens"]))


@contextmanager
def batch_logits_processors(state: dict, input_ids: torch.Tensor) -> Iterator[HFLogitsProcessor | None]:
    """This request in the loaded processors' batch for the length of the block (None: none loaded)."""
    params = request_params(state)
    runner = shared.logits_processors
    if runner is None:
        yield None
        return
    with runner.session([(params, input_ids[0].tolist())]) as bridge:
        yield bridge


def tokenized_inputs(question: str, state: dict) -> tuple[str, torch.Tensor, torch.Tensor | None]:
    room = get_max_prompt_length(state)
    whole = encode(text_for_plain_ids(question), add_bos_token=state["add_bos_token"])
    input_ids = whole[:, -room:] if room > 0 else whole  # as text-generation-webui: its end is kept
    state.pop(model_inputs.MODEL_ROUTE, None)  # a route is for the prompt the hook sees now, never an old one
    question, ids, inputs_embeds = apply_extensions("tokenizer", state, question, input_ids, None)
    if ids is input_ids and input_ids.shape[-1] < whole.shape[-1]:  # no hook gave ids of its own
        state.setdefault("notices", []).append(
            f"The prompt was cut to its last {room} tokens to fit the context (truncation_length - max_new_tokens): "
            f"its first {whole.shape[-1] - room} tokens are left out. Send a shorter message, or raise "
            f"truncation_length.")
    return question, ids, inputs_embeds


def text_for_plain_ids(question: str) -> str:
    """The prompt to tokenize before the `tokenizer` hook runs.

    Image tags carry kilobytes to megabytes of base64 each; the extension that writes them (it says so
    through `image_tag_pattern`) replaces the ids of such prompts in its `tokenizer_modifier`, so
    the tags are left out here instead of tokenized on every turn. A chat prompt's text without them
    is known from its render (`picture_stand_ins`); any other prompt is searched for tags here.
    """
    pattern = apply_extensions("image_tag_pattern")
    if pattern is None or not any(hasattr(ext, "tokenizer_modifier") for ext, _ in iterator()):
        return question
    plain = picture_stand_ins.plain_text(question)  # a chat prompt: known from its render
    return plain if plain is not None else pattern.sub("", question)


# All model compute (the tokenizer hook's vision forward, prefill, decoding) runs on one long-lived
# thread: requests arrive on many threads (Gradio, the API), and each new thread that calls into
# torch builds and warms its own OpenMP team, which cost a prefill up to ~40% on 2 CPU cores.
_compute_thread: ThreadPoolExecutor | None = None


def compute_thread() -> ThreadPoolExecutor:
    global _compute_thread
    if _compute_thread is None:
        _compute_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation")
    return _compute_thread


@dataclass
class PromptReady:
    """The first event of a generation: the prompt's length in tokens (image tokens included)."""
    tokens: int


def produce(question: str, state: dict, stop_event: threading.Event, events: queue.SimpleQueue) -> None:
    """On the compute thread: model inputs, then `model.generate`; every outcome goes to `events`."""
    try:
        with torch.inference_mode():
            question, input_ids, inputs_embeds = tokenized_inputs(question, state)
            events.put(PromptReady(int(input_ids.shape[-1])))
            with batch_logits_processors(state, input_ids) as batch_processors:
                kwargs, prompt_embeds = generate_kwargs(input_ids, inputs_embeds, state, stop_event, batch_processors)
                on_tokens = batch_processors.take_tokens if batch_processors is not None else None
                static_decode.graphs_on_this_thread()
                output = shared.model.generate(**kwargs, streamer=TokenQueue(events, on_tokens))
            if prompt_embeds is not None:
                prefix_cache.keep(shared.model, prompt_embeds, output.past_key_values)
    except Exception as error:  # handed to the consuming thread, which re-raises it
        prefix_cache.clear()
        events.put(error)
    finally:
        events.put(None)


def generate_kwargs(input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None, state: dict,
                    stop_event: threading.Event,
                    batch_processors: HFLogitsProcessor | None = None) -> tuple[dict, torch.Tensor | None]:
    kwargs = sampling_params(state)
    prompt_tokens = input_ids.shape[-1] if inputs_embeds is None else inputs_embeds.shape[1]
    inputs, prompt_embeds = model_inputs.generate_inputs(input_ids, inputs_embeds, prefix_cache_enabled(state),
                                                         state.pop(model_inputs.MODEL_ROUTE, None),
                                                         static_decode.cache_length(state, prompt_tokens))
    kwargs.update(inputs)
    # The batch-level processors see the raw logits first, as in vLLM; extensions append theirs after.
    first = [batch_processors] if batch_processors is not None else []
    processors = apply_extensions("logits_processor", LogitsProcessorList(first), input_ids)
    kwargs["logits_processor"] = LogitsProcessorList(processors)
    kwargs["stopping_criteria"] = StoppingCriteriaList([StopOnEvent(stop_event, state)])
    kwargs["return_dict_in_generate"] = True
    return kwargs, prompt_embeds


def stream_events(question: str, state: dict, stop_event: threading.Event) -> Iterator[PromptReady | list[int]]:
    """Runs `produce` on the compute thread; yields its events, re-raising its error. Token ids that
    arrived while the consumer was busy, or within the state's update interval, come as one list: it
    catches up with one update, not one per token."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    ended = threading.Event()
    done = compute_thread().submit(produce, question, state, stop_event, events)
    done.add_done_callback(lambda _: ended.set())
    try:
        for item in merged_tokens(events, update_interval(state), ended):
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop_event.set()
        done.result()


_NOT_TAKEN = object()  # merged_tokens: no event taken after the tokens yet (None is the end)


def update_interval(state: dict) -> float:
    """Seconds between two updates of a streamed reply: `max_updates_second` (0 or unset: no wait)."""
    rate = float(state.get("max_updates_second") or 0)
    return 1 / rate if rate > 0 else 0.0


def merged_tokens(events: queue.SimpleQueue, interval: float = 0.0,
                  ended: threading.Event | None = None) -> Iterator[PromptReady | list[int] | Exception]:
    """`events` in order until the None that ends them, consecutive token lists already queued merged into
    one. After a token list, the next is taken no sooner than `interval` seconds after it was handed out:
    what arrived meanwhile comes merged. Once `ended` is set (the producer has put its last event) that
    wait stops at once, so the reply's end is not held back by up to an interval."""
    ended = ended or threading.Event()  # never set: the whole interval
    item = events.get()
    while item is not None:
        if not isinstance(item, list):
            yield item
            item = events.get()
            continue
        tokens, item = list(item), _NOT_TAKEN
        while not events.empty():
            item = events.get_nowait()
            if not isinstance(item, list):
                break
            tokens.extend(item)
            item = _NOT_TAKEN
        handed_out = time.perf_counter()
        yield tokens
        if item is _NOT_TAKEN:
            rest = interval - (time.perf_counter() - handed_out)
            if rest > 0:
                ended.wait(rest)
            item = events.get()


def prefix_cache_enabled(state: dict) -> bool:
    return bool(state.get("prefix_cache", True)) and not shared.args.no_prefix_cache


def partial_stop_index(text: str, stopping_strings: list[str]) -> int:
    """Where a possible start of a stopping string begins at the end of `text` (held back while streaming)."""
    longest = max((len(s) for s in stopping_strings), default=0)
    for i in range(max(0, len(text) - longest + 1), len(text)):
        tail = text[i:]
        if any(s.startswith(tail) for s in stopping_strings):
            return i
    return len(text)


def generate_reply(question: str, state: dict, stopping_strings: list[str] | None = None, is_chat: bool = False,
                   escape_html: bool = False, for_ui: bool = False) -> Iterator[str]:
    """Yields the cumulative reply. Records counts in `state['generation_stats']`. The local model
    generates one reply at a time; a remote engine takes replies side by side."""
    concurrent = shared.engine is not None and shared.engine.concurrent
    with nullcontext() if concurrent else shared.generation_lock:
        if not concurrent:
            shared.stop_everything = False  # a stop meant for the reply before this one
        yield from _generate_reply(question, state, stopping_strings, is_chat)


def _generate_reply(question: str, state: dict, stopping_strings: list[str] | None, is_chat: bool) -> Iterator[str]:
    if shared.model is None:
        raise RuntimeError(shared.NO_MODEL_MESSAGE)
    state["seed"] = set_seed(state.get("seed", -1))
    original_question = question
    if not is_chat:  # a chat turn ran both hooks already (chat.start_turn, chatbot_wrapper)
        apply_state_modifiers(state)
        question = apply_extensions("input", question, state)
    # Extensions append what the user should be told (e.g. images dropped); a chat turn's list starts
    # before its chat_input hooks (chat.chatbot_wrapper), which may already have said something.
    state.setdefault("notices", [])
    stops = list(stopping_strings or []) + get_custom_stopping_strings(state)
    stats = {"prompt_tokens": 0, "completion_tokens": 0, "finish_reason": "length"}
    state["generation_stats"] = stats
    # text-generation-webui: the first extension that has the attribute now (it may come and go) generates.
    custom = apply_extensions("custom_generate_reply")
    generate_func = custom if custom is not None else generate_reply_HF
    started = time.time()
    replies = generate_func(question, original_question, state, stopping_strings, is_chat=is_chat)
    reply = yield from cut_at_stops(replies, stops, stats, state)
    if custom is not None:
        count_custom_tokens(question, reply, stats)
    if not is_chat:
        reply = apply_extensions("output", reply, state)
    elapsed = max(time.time() - started, 1e-6)
    tokens = stats["completion_tokens"]
    logger.info(f"Output generated in {elapsed:.2f} seconds ({tokens / elapsed:.2f} tokens/s, "
                f"{tokens} tokens, context {stats['prompt_tokens']}, seed {state['seed']})")
    yield reply


def cut_at_stops(replies: Iterable[str], stops: list[str], stats: dict, state: dict) -> Generator[str, None, str]:
    """Yields each cumulative reply, holding back a possible start of a stopping string; returns the
    last reply, cut before the first stopping string. Ends at that string or at the stop button."""
    replies = iter(replies)
    reply = ""
    try:
        for reply in replies:
            hit = min((reply.find(s) for s in stops if s in reply), default=-1)
            if hit >= 0:
                stats["finish_reason"] = "stop"
                return reply[:hit]
            yield reply[:partial_stop_index(reply, stops)] if stops else reply
            if stop_requested(state):
                break
        if stop_requested(state):  # also when the host's model stopped itself on the flag
            stats["finish_reason"] = "stop"
        return reply
    finally:
        # A generator stops its work here (the host's: model.generate), before the lock is released.
        if hasattr(replies, "close"):
            replies.close()


def generate_reply_HF(question: str, original_question: str, state: dict, stopping_strings: list[str] | None = None,
                      is_chat: bool = False) -> Iterator[str]:
    """The host's own generation, under text-generation-webui's name and signature so that a
    `custom_generate_reply` can delegate to it: the local model's, or the remote engine's
    (`modules/remote_generation.py`). Yields the cumulative decoded reply; the caller
    (`_generate_reply`) applies the stopping strings and, for the local model, holds
    `shared.generation_lock`. Records token counts and an EOS finish in `state['generation_stats']`."""
    stats = state.setdefault("generation_stats",
                             {"prompt_tokens": 0, "completion_tokens": 0, "finish_reason": "length"})
    stops = list(stopping_strings or []) + get_custom_stopping_strings(state)
    if shared.engine is not None:
        yield from remote_replies(question, state, stops, request_params(state))
        return
    skip_special = state.get("skip_special_tokens", True)
    reply = ReplyText(lambda ids: decode(ids, skip_special))
    text = None
    for event in stream_events(question, state, threading.Event()):
        if isinstance(event, PromptReady):
            stats["prompt_tokens"] = event.tokens
            continue
        text = add_until_stop(reply, event, stops)
        stats["completion_tokens"] = len(reply.ids)
        yield text
    if reply.ids and reply.finish() != text:  # the whole decode, where a step's text was not exact
        yield reply.text
    if reply.ids and reply.ids[-1] == shared.tokenizer.eos_token_id:
        stats["finish_reason"] = "stop"


def add_until_stop(reply: ReplyText, ids: list[int], stops: list[str]) -> str:
    """The reply's text after `ids`, taken one at a time up to the one that completes a stopping string:
    tokens that came together (the update interval merges them) are not counted past the stop, which
    the caller cuts at (`cut_at_stops`), as vLLM counts."""
    if not stops:
        return reply.add(ids)
    longest, text = max(len(s) for s in stops), reply.text
    for token in ids:
        seen = len(reply.text)
        text = reply.add([token])
        if any(s in text[max(seen - longest + 1, 0):] for s in stops):
            break
    return text


def count_custom_tokens(question: str, reply: str, stats: dict) -> None:
    """Counts for a `custom_generate_reply`: one that went through `generate_reply_HF` recorded exact
    ones; otherwise the prompt and the reply texts are tokenized once."""
    if stats["prompt_tokens"] == 0:
        stats["prompt_tokens"] = get_encoded_length(question)
    if stats["completion_tokens"] == 0 and reply:
        stats["completion_tokens"] = len(encode(reply, add_special_tokens=False)[0])
