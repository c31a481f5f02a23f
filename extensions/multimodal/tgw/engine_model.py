"""With a remote engine, the model text-generation-webui loads is its folder without the weights.

vLLM holds the weights; text-generation-webui still needs a model for its chat: the folder's config,
tokenizer, chat template and processor, and `shared.model` to hand `generate()` to. So, while an engine is
set, its Transformers loader (`AutoModelForCausalLM.from_pretrained`) builds the model on PyTorch's meta
device, which allocates nothing; the input embedding alone is a real tensor (one value broadcast), so
code that asks where the model's inputs go hears the CPU. The model's `generate()` is the engine's
(tgw/remote_generation.py), and moving it (`to`, `cuda`) is a no-op: there is nothing to move.

This module imports no `modules.*` and nothing of the extension at import time: launch.py installs it
before text-generation-webui's server.py runs, so a `--model` given on the command line loads this way too.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch


def install() -> None:
    """Make `AutoModelForCausalLM.from_pretrained` load folders without their weights (idempotent)."""
    from transformers import AutoModelForCausalLM

    if getattr(AutoModelForCausalLM.from_pretrained, "loads_without_weights", False):
        return

    def from_pretrained(cls, path, *args, trust_remote_code: bool = False, **kwargs):
        return without_weights(cls, Path(path), trust_remote_code)

    from_pretrained.loads_without_weights = True
    AutoModelForCausalLM.from_pretrained = classmethod(from_pretrained)


def without_weights(auto_class, path: Path, trust_remote_code: bool = False):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = auto_class.from_config(config, trust_remote_code=trust_remote_code)
    embedding = model.get_input_embeddings()
    embedding.weight = torch.nn.Parameter(torch.zeros(1).expand(embedding.weight.shape), requires_grad=False)
    model.eval()
    return answered_by_engine(model)


def answered_by_engine(model):
    """`model`, its `generate()` the engine's; it keeps its class's name (hosts look classes up by name)."""
    if getattr(model, "answered_by_engine", False):
        return model
    cls = type(model)
    model.__class__ = type(cls.__name__, (cls,), {
        "answered_by_engine": True, "generate": _engine_generate, "forward": _no_forward, "to": _itself,
        "cuda": _itself, "device": property(lambda self: torch.device("cpu"))})
    return model


def _no_forward(self, *args, **kwargs):
    # text-generation-webui's token probabilities (its /v1/internal/logits, the Notebook's button) run
    # the model itself; without weights it could only fail on a meta tensor.
    raise RuntimeError("The model's weights are in the remote engine (the multimodal extension's engine_url), not "
                       "here: what runs the model itself, such as next-token probabilities, cannot; ask the "
                       "engine (vLLM's logprobs) instead.")


def _engine_generate(self, *args, **kwargs):
    # Imported when called: by then the extension's package is registered (launch.py runs before it is).
    return importlib.import_module("extensions.multimodal.tgw.remote_generation").generate(*args, **kwargs)


def _itself(self, *args, **kwargs):
    return self
