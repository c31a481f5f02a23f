"""text-generation-webui's replies from a remote engine (vLLM), with this extension's pictures and costs.

Set `multimodal-engine_url` (settings), or start text-generation-webui through launch.py with
`--multimodal-engine-url URL` (it sets MULTIMODAL_ENGINE_URL). Then text-generation-webui's own
generation runs unchanged - its chat, regenerate and continue, its API, samplers in the state,
stopping strings, streaming, the Stop button - and only two of its steps change:
- the tokenizer hook (`open_reply`) sends the prompt, as text-generation-webui rendered it, to the
  engine: the text around its pictures (tags, or `<__media__>` markers with the pictures in the state)
  and the pictures' bytes, laid out and budgeted as locally (core/engine_prompt.py). A refusal or an
  engine that is down is raised here, as the host's own error (the API's 400, the page's message). It
  returns the prompt's ids as the engine tokenized them;
- the model's `generate()` (tgw/engine_model.py) hands text-generation-webui the engine's reply tokens
  one by one, through its own stopping criteria: its streaming, stopping strings and Stop button work
  as with a local model, and closing the stream makes vLLM abort the request.
The BOS is text-generation-webui's: the one its `encode()` starts the prompt's first text with.
Samplers vLLM does not have are refused when set to anything but their neutral value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from extensions.multimodal.core.engine_prompt import engine_prompt
from extensions.multimodal.tgw.engine_client import (KEY_VARIABLE, EngineClient, EngineRefusedError,
                                                     EngineUnavailableError, ReplyStream, engine_url, request_body)
from extensions.multimodal.tgw.native_media import with_state_pictures
from modules import shared
from modules.logging_colors import logger
from modules.text_generation import encode

# text-generation-webui's samplers that vLLM has no equal of, at the values that leave them off.
NEUTRAL_SAMPLERS = {"typical_p": 1, "tfs": 1, "top_a": 0, "top_n_sigma": 0, "epsilon_cutoff": 0, "eta_cutoff": 0,
                    "smoothing_factor": 0, "dynamic_temperature": False, "xtc_probability": 0, "dry_multiplier": 0,
                    "mirostat_mode": 0, "penalty_alpha": 0, "guidance_scale": 1, "no_repeat_ngram_size": 0,
                    "encoder_repetition_penalty": 1, "prompt_lookup_num_tokens": 0, "negative_prompt": "",
                    "grammar_string": "", "adaptive_target": 0,
                    # text-generation-webui's count the prompt's tokens too (within the range), vLLM's the reply's only
                    "presence_penalty": 0, "frequency_penalty": 0}


@dataclass
class PendingReply:
    stream: ReplyStream
    prompt_ids: torch.Tensor  # (1, n): the prompt as the engine tokenized it, as returned to the host


@dataclass(frozen=True)
class Served:
    name: str  # the name vLLM serves text-generation-webui's model under
    context: Optional[int]  # vLLM's max_model_len for it, where it says


_pending: Optional[PendingReply] = None  # opened by the tokenizer hook, consumed by generate()
_clients: dict[tuple, EngineClient] = {}
_served: dict[tuple, Served] = {}  # (engine URL, text-generation-webui's model) -> how vLLM serves it
_told: set[tuple[int, int]] = set()  # (truncation_length, engine context) pairs the log has named


def client(params: dict) -> EngineClient:
    key = (engine_url(params), str(params.get("engine_api_key") or os.environ.get(KEY_VARIABLE) or ""),
           float(params.get("engine_timeout") or 120))
    if key not in _clients:
        _clients[key] = EngineClient(*key)
    return _clients[key]


def open_reply(prompt: str, state: dict, params: dict) -> torch.Tensor:
    """The tokenizer hook with an engine: send the prompt; its ids as the engine tokenized them."""
    global _pending
    discard_pending()
    refuse_unsupported(state)
    tagged = with_state_pictures(prompt, state, params)
    laid_out = engine_prompt(tagged, state, params) or {"pieces": [tagged], "images": [], "placeholder": "",
                                                        "processor_kwargs": {}}
    pieces = list(laid_out["pieces"])
    pieces[0] = with_hosts_bos(pieces[0], state)
    engine = client(params)
    try:
        body = request_body(served(engine).name, pieces, laid_out["images"], laid_out["placeholder"], False,
                            sampling(state, params), laid_out["processor_kwargs"])
        stream = engine.open(body, lambda: bool(shared.stop_everything))
        first = next(stream, None)
    except (EngineRefusedError, EngineUnavailableError):
        forget_served()  # a vLLM restarted under another name or context is asked again next turn
        raise
    if first is None or first.prompt_token_ids is None:
        stream.close()
        raise EngineUnavailableError(f"The {engine.description} sent no prompt ids: is it vLLM 0.10 or later?")
    ids = torch.tensor([first.prompt_token_ids], dtype=torch.int64)
    refuse_short_penalty_range(state, ids.shape[-1], stream)
    _pending = PendingReply(stream, ids)
    logger.info(f"Multimodal: {ids.shape[-1]} prompt tokens, {len(laid_out['images'])} picture(s), to the {engine.description}")
    return ids


def generate(inputs: Optional[torch.Tensor] = None, stopping_criteria=(), logits_processor=None, **_samplers):
    """The model's `generate()` with an engine: the prompt's ids, then the reply's tokens as the engine
    sends them, each passed through text-generation-webui's stopping criteria (its streaming, stopping
    strings and Stop button). The samplers came from the state when the request was sent."""
    global _pending
    reply, _pending = _pending, None
    if reply is None or inputs is None or not torch.equal(inputs.cpu(), reply.prompt_ids):
        raise RuntimeError("The engine's generate() was called for a prompt the tokenizer hook did not send.")
    if logits_processor:
        reply.stream.close()
        raise ValueError(f"Logits processors ({', '.join(type(p).__name__ for p in logits_processor)}) cannot run "
                         f"in the engine; turn them off (grammar, logit bias, other extensions) to use it.")
    sequence = inputs
    try:
        for chunk in reply.stream:
            for token in chunk.token_ids:
                sequence = torch.cat([sequence, torch.tensor([[token]], device=sequence.device)], dim=1)
                if any(bool(torch.as_tensor(stop(sequence, None)).any()) for stop in stopping_criteria):
                    return sequence
    except EngineUnavailableError:
        forget_served()  # broken off: vLLM may come back restarted, and is asked again next turn
        raise
    finally:
        reply.stream.close()
    return sequence


def discard_pending() -> None:
    """Close a reply opened but never generated (an error between the hook and generate())."""
    global _pending
    if _pending is not None:
        _pending.stream.close()
        _pending = None


def served(engine: EngineClient) -> Served:
    """The engine's model: the only one it serves, else the one named as text-generation-webui's. Asked
    once per engine and loaded model, not every turn."""
    key = (engine.url, shared.model_name)
    if key not in _served:
        _served[key] = ask_served(engine)
    return _served[key]


def forget_served() -> None:
    _served.clear()


def ask_served(engine: EngineClient) -> Served:
    models = engine.served_models()
    names = list(models)
    name = names[0] if len(names) == 1 else shared.model_name if shared.model_name in names else None
    if name is None:
        raise EngineUnavailableError(f"The {engine.description} serves {', '.join(names) or 'no model'}; load the "
                                     f"folder of one of them (named as served) in text-generation-webui.")
    return Served(name, models[name])


def within_context(state: dict, params: dict) -> None:
    """text-generation-webui's `truncation_length` (8192 whatever the model, by default) made at most the
    engine's context, so that a long chat leaves out its oldest turns to fit rather than being refused
    whole. An engine that cannot be asked now leaves it: sending the prompt says why."""
    try:
        context = served(client(params)).context
    except (EngineUnavailableError, EngineRefusedError):
        return
    asked = int(state.get("truncation_length") or 0)
    if context and asked > context:
        state["truncation_length"] = context
        if (asked, context) not in _told:  # once, not every turn: the page's slider still shows its own
            _told.add((asked, context))
            logger.info(f"Multimodal: truncation_length {asked} is more than the engine's context: chats leave "
                        f"out their oldest turns to fit its {context} tokens")


def with_hosts_bos(text: str, state: dict) -> str:
    """The prompt's start with the BOS text-generation-webui's `encode()` gives it, written in (the engine
    adds no special tokens of its own)."""
    bos, bos_id = getattr(shared.tokenizer, "bos_token", None), getattr(shared.tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return text
    ids = encode(text, add_bos_token=bool(state.get("add_bos_token", True)))[0]
    while text.startswith(bos):  # encode() leaves at most one, wherever it came from
        text = text[len(bos):]
    return bos + text if len(ids) > 0 and int(ids[0]) == bos_id else text


def refuse_unsupported(state: dict) -> None:
    changed = [key for key, neutral in NEUTRAL_SAMPLERS.items() if key in state and state[key] != neutral]
    if changed:
        raise EngineRefusedError(f"The engine (vLLM) has no equal of {', '.join(changed)}: set them to their neutral "
                                 f"values (the 'Neutralize samplers' button) to use it.")
    if state.get("logits_processor"):
        raise EngineRefusedError("Logits processors (logit_bias, logprobs) cannot run in the engine: leave them out to use it.")


def refuse_short_penalty_range(state: dict, prompt_tokens: int, stream) -> None:
    """vLLM's repetition penalty sees the whole prompt and reply; text-generation-webui's, their last
    `repetition_penalty_range` tokens (0: all). Refused where the two differ, once the prompt's length is known."""
    penalty, window = float(state.get("repetition_penalty", 1)), int(state.get("repetition_penalty_range") or 0)
    needed = prompt_tokens + int(state.get("max_new_tokens") or 0)
    if penalty != 1 and 0 < window < needed:
        stream.close()
        raise EngineRefusedError(
            f"The engine (vLLM) applies repetition_penalty to the whole prompt and reply ({needed} tokens here), not "
            f"to their last repetition_penalty_range ({window}): set repetition_penalty_range to 0 (all tokens), or "
            f"repetition_penalty to 1, to use it.")


def sampling(state: dict, params: dict) -> dict[str, Any]:
    """The state's samplers as vLLM's request fields."""
    fields: dict[str, Any] = {"repetition_penalty": float(state.get("repetition_penalty", 1)),
                              "seed": int(torch.randint(0, 2**31 - 1, (1,)))}  # from the seed the host just set
    if not state.get("auto_max_new_tokens"):
        fields["max_tokens"] = int(state["max_new_tokens"])
    if state.get("do_sample", True):
        fields.update(temperature=float(state.get("temperature", 1)), top_p=float(state.get("top_p", 1)),
                      top_k=int(state.get("top_k") or 0) or -1, min_p=float(state.get("min_p", 0)))
    else:
        fields["temperature"] = 0.0
    banned = banned_ids(state)
    if banned:
        fields["logit_bias"] = {str(token): -100 for token in banned}  # OpenAI's strongest bias: never chosen
    return fields


def banned_ids(state: dict) -> list[int]:
    """EOS when banned, and the custom token bans (as text-generation-webui's `suppress_tokens`)."""
    banned = [int(token) for token in str(state.get("custom_token_bans") or "").split(",") if token.strip()]
    eos = getattr(shared.tokenizer, "eos_token_id", None)
    if state.get("ban_eos_token") and eos is not None:
        banned.append(int(eos))
    return sorted(set(banned))
