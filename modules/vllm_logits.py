"""The host's logits processors inside vLLM, unchanged: vLLM loads them through this adapter.

    vllm serve MODEL --logits-processors modules.vllm_logits:examples.target_token.TargetTokenLogitsProcessor

vLLM takes `module:Qualified.Name` and walks the name attribute by attribute; here the walk is a
module path, so `modules.vllm_logits:PACKAGE.MODULE.Class` gives `PACKAGE.MODULE.Class` (a subclass
of `modules.logits_processors.LogitsProcessor`) wrapped as a vLLM logits processor (`for_vllm`).
vLLM must be started where this repository is importable (its root as the working directory, or on
PYTHONPATH). Per request, vLLM's `vllm_xargs` are the processor's `RequestParams.extra_args`, as the
host's `logits_processor_args` are on the local engine.

What the adapter translates: vLLM's `VllmConfig` becomes a `HostConfig` (the model's transformers
config; no command line, settings or tokenizer: the host's own are not there); each `SamplingParams`
becomes `RequestParams`; vLLM's batch updates (removes, adds, moves) become the host's, entry by
entry. This module imports vLLM: only vLLM's process loads it, never the host.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Any, Optional

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate as VllmBatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as VllmLogitsProcessor
from vllm.v1.sample.logits_processor import MoveDirectionality as VllmMove

from modules.logits_processors import (AddedRequest, BatchUpdate, HostConfig, LogitsProcessor,
                                       MoveDirectionality, MovedRequest, RequestParams)

DIRECTIONS = {VllmMove.UNIDIRECTIONAL: MoveDirectionality.UNIDIRECTIONAL, VllmMove.SWAP: MoveDirectionality.SWAP}
_adapted: dict[type, type] = {}


def request_params(params: SamplingParams) -> RequestParams:
    greedy = params.temperature == 0
    return RequestParams(extra_args=params.extra_args, greedy=greedy, temperature=0.0 if greedy else params.temperature,
                         top_p=params.top_p, top_k=max(params.top_k, 0), max_new_tokens=params.max_tokens or 0)


def batch_update(update: VllmBatchUpdate) -> BatchUpdate:
    return BatchUpdate(
        batch_size=update.batch_size, removed=list(update.removed),
        added=[AddedRequest(index, request_params(params), prompt, output)
               for index, params, prompt, output in update.added],
        moved=[MovedRequest(a, b, DIRECTIONS[direction]) for a, b, direction in update.moved])


def for_vllm(processor_class: type[LogitsProcessor]) -> type[VllmLogitsProcessor]:
    """`processor_class` as a vLLM logits processor (one adapted class per processor class)."""
    if processor_class not in _adapted:
        _adapted[processor_class] = type(processor_class.__name__, (_Adapter,), {"wrapped": processor_class})
    return _adapted[processor_class]


class _Adapter(VllmLogitsProcessor):
    wrapped: type[LogitsProcessor]

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        model_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
        config = HostConfig(args=argparse.Namespace(), settings={}, model_config=model_config)
        self.processor = self.wrapped(config, device, is_pin_memory)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        cls.wrapped.validate_params(request_params(sampling_params))

    def is_argmax_invariant(self) -> bool:
        return self.processor.is_argmax_invariant()

    def update_state(self, update: Optional[VllmBatchUpdate]) -> None:
        self.processor.update_state(batch_update(update) if update is not None else None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return self.processor.apply(logits)


class _Path:
    """A dotted path being walked by vLLM's loader: a package or module, until the walk reaches a class."""

    def __init__(self, path: str):
        self.path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(f"{self.path}.{name}")


def resolve(path: str) -> Any:
    """`path` as a module (to walk on), or as a module's processor class (adapted)."""
    module_path, _, name = path.rpartition(".")
    try:
        importlib.import_module(path)
        return _Path(path)
    except ModuleNotFoundError as error:
        if error.name != path or not module_path:
            raise
    found = getattr(importlib.import_module(module_path), name)
    if not (isinstance(found, type) and issubclass(found, LogitsProcessor)):
        raise TypeError(f"{path} is not a subclass of modules.logits_processors.LogitsProcessor")
    return for_vllm(found)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return resolve(name)
