"""A reply from the remote engine (`shared.engine`), in place of the local model's `generate()`.

The prompt is the one the host built for the local model, after every hook that shapes it. The
extension that writes picture tags says, through `engine_prompt`, where the pictures are and what
each costs; the engine gets the text around them, the pictures as data URLs, and the state's
samplers under vLLM's names. The BOS is the local engine's: the template's own, else the
tokenizer's (`add_special_tokens`), else the one `add_bos_token` asks for, written into the text.
A request's logits-processor arguments go to the engine as `vllm_xargs` when the host was told which
processors the engine runs (`--logits-processors` beside `--engine-url`; vLLM loads the same classes
through `modules/vllm_logits.py`): the host checks them with those classes first. Told none, the host
refuses such a request rather than let the engine ignore the arguments.
"""
from __future__ import annotations

from contextlib import closing
from typing import Any, Iterator

from modules import shared
from modules.engine import EngineChunk, EngineRequest
from modules.extensions import apply_extensions
from modules.logits_processors import RequestParams

ENGINE_STOPS = 4  # the most stopping strings vLLM takes by default (VLLM_MAX_STOP_STRINGS), as OpenAI


def remote_replies(question: str, state: dict, stopping_strings: list[str], params: RequestParams) -> Iterator[str]:
    """Cumulative reply texts; counts and the finish go to `state['generation_stats']`. The stop button
    and a client that leaves set the state's stop, which closes the engine's stream at once."""
    # Closed however this generator ends (the stop button, a client gone): the engine aborts the request.
    request = engine_request(question, state, stopping_strings, params)
    with closing(shared.engine.stream(request, state.get(shared.STOP_EVENT))) as chunks:
        yield from cumulative(chunks, state)


def cumulative(chunks: Iterator[EngineChunk], state: dict) -> Iterator[str]:
    stats = state["generation_stats"]
    reply = ""
    for chunk in chunks:
        if chunk.prompt_tokens is not None:
            stats["prompt_tokens"] = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            stats["completion_tokens"] = chunk.completion_tokens
        if chunk.finish_reason is not None:
            stats["finish_reason"] = "length" if chunk.finish_reason == "length" else "stop"
        if chunk.text:
            reply += chunk.text
            yield reply


def engine_request(question: str, state: dict, stopping_strings: list[str], params: RequestParams) -> EngineRequest:
    prompt = apply_extensions("engine_prompt", question, state) or {"pieces": [question], "images": [],
                                                                     "placeholder": "", "processor_kwargs": {}}
    pieces = list(prompt["pieces"])
    pieces[0], add_special_tokens = with_bos(pieces[0], state)
    return EngineRequest(prompt_pieces=pieces, images=list(prompt["images"]), image_placeholder=prompt["placeholder"],
                         add_special_tokens=add_special_tokens,
                         sampling=sampling(state, stopping_strings, params.greedy) | processor_args(params),
                         processor_kwargs=dict(prompt["processor_kwargs"]))


def with_bos(text: str, state: dict) -> tuple[str, bool]:
    """(the prompt's start, whether the engine's tokenizer adds its special tokens), giving the ids
    `text_generation.encode` gives: one BOS where the template wrote it or the tokenizer adds it, and
    one written in when `add_bos_token` asks for one the tokenizer would not add."""
    tokenizer = shared.tokenizer
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        return text, False
    if bos and state.get("add_bos_token", True) and not tokenizer_adds_bos(tokenizer):
        return bos + text, False
    return text, True


def tokenizer_adds_bos(tokenizer) -> bool:
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def processor_args(params: RequestParams) -> dict[str, Any]:
    """The request's logits-processor arguments as `vllm_xargs`, checked by the processors the engine runs."""
    if not params.extra_args:
        return {}
    processors = shared.engine.logits_processors
    if not processors:
        raise ValueError(f"logits_processor_args (vllm_xargs) need logits processors in the engine: start the "
                         f"{shared.engine.description} with --logits-processors modules.vllm_logits:MODULE.Class, and "
                         f"this host with --logits-processors MODULE:Class to say so.")
    for processor in processors:
        processor.validate_params(params)
    return {"vllm_xargs": dict(params.extra_args)}


def sampling(state: dict, stopping_strings: list[str], greedy: bool) -> dict[str, Any]:
    """The state's samplers as an OpenAI / vLLM request's fields (`text_generation.sampling_params`' twin)."""
    fields: dict[str, Any] = {"max_tokens": int(state["max_new_tokens"]), "seed": int(state["seed"]),
                              "repetition_penalty": float(state["repetition_penalty"]),
                              "skip_special_tokens": bool(state.get("skip_special_tokens", True))}
    if greedy:
        fields["temperature"] = 0.0
    else:
        fields.update(temperature=float(state["temperature"]), top_p=float(state["top_p"]),
                      top_k=int(state.get("top_k") or 0) or -1)
    if stopping_strings:  # the engine stops early at the first few; the host cuts at them all
        fields["stop"] = list(stopping_strings)[:ENGINE_STOPS]
    eos = getattr(shared.tokenizer, "eos_token_id", None)
    if state.get("ban_eos_token") and eos is not None:
        fields["logit_bias"] = {str(eos): -100}  # OpenAI's strongest bias: never chosen
    return fields
