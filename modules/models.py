"""Loading a Hugging Face model folder into `shared.model` / `shared.tokenizer` / `shared.processor`.

`load_model(name)` picks the transformers Auto class from the folder's config.json:
- configs with a `vision_config` (LLaVA, Qwen2.5-VL, Gemma 3, ...) load with
  `AutoModelForImageTextToText` (`shared.is_multimodal`) and keep their `AutoProcessor` in
  `shared.processor` when it loads here (several need torchvision; without it the processor is
  None and the multimodal extension builds one from the folder's parts);
- original LLaVA checkpoints (`model_type: llava_llama`) load as plain Llama causal LMs; their
  `model.mm_projector.*` tensors stay on disk for the multimodal pipeline to read;
- everything else loads with `AutoModelForCausalLM`.
It does not build prompts or generate.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor,
                          AutoTokenizer)

from modules import model_settings, shared
from modules.logging_colors import logger


def resolve_model_path(name: str) -> Path:
    """A folder under `--model-dir`, else `name` taken as a path."""
    under_dir = Path(shared.args.model_dir) / name
    if under_dir.is_dir():
        return under_dir
    if not Path(shared.args.model_dir).is_absolute():
        under_root = shared.ROOT / shared.args.model_dir / name
        if under_root.is_dir():
            return under_root
    as_path = Path(name).expanduser()
    if as_path.is_dir():
        return as_path
    raise FileNotFoundError(
        f"Model '{name}' not found: no folder {under_dir} and no folder at that path. "
        f"Put a Hugging Face model folder under {shared.args.model_dir} (see models/README.md)."
    )


def read_config_dict(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{path} holds no config.json: is it a Hugging Face model folder?")
    return json.loads(config_file.read_text(encoding="utf-8"))


def is_image_text_config(config: dict[str, Any]) -> bool:
    return "vision_config" in config


def pick_dtype() -> torch.dtype:
    """CUDA: float16, or bfloat16 with --bf16. CPU: float32, or bfloat16 with --bf16 (CPUs with AVX-512 BF16 /
    AMX multiply it about twice as fast; float16 has no fast path on CPUs)."""
    if use_cuda():
        return torch.bfloat16 if shared.args.bf16 else torch.float16
    return torch.bfloat16 if shared.args.bf16 else torch.float32


def use_cuda() -> bool:
    return torch.cuda.is_available() and not shared.args.cpu


def quantization_config() -> transformers.BitsAndBytesConfig | None:
    if not (shared.args.load_in_8bit or shared.args.load_in_4bit):
        return None
    if not use_cuda():
        raise ValueError("--load-in-8bit and --load-in-4bit need CUDA (bitsandbytes); this machine runs on the CPU. "
                         "Drop the flag to load full-precision weights.")
    if shared.args.load_in_4bit:
        return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=pick_dtype())
    return transformers.BitsAndBytesConfig(load_in_8bit=True)


def loading_kwargs() -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dtype": pick_dtype(), "trust_remote_code": shared.args.trust_remote_code}
    if use_cuda():
        kwargs["device_map"] = "auto"  # accelerate places the layers
    quant = quantization_config()
    if quant is not None:
        kwargs["quantization_config"] = quant
    return kwargs


def load_llava_llama(path: Path, config: dict[str, Any], kwargs: dict[str, Any]):
    # Original LLaVA releases: a Llama LM whose folder also carries mm_projector (and sometimes
    # vision tower) tensors. transformers knows no `llava_llama` type (text-generation-webui #4692).
    llama_config = transformers.LlamaConfig.from_dict({**config, "model_type": "llama"})
    return AutoModelForCausalLM.from_pretrained(path, config=llama_config, **kwargs)


def load_model(model_name: str):
    """Load a model folder; returns `(model, tokenizer)` and sets `shared.processor`."""
    path = resolve_model_path(model_name)
    config = read_config_dict(path)
    kwargs = loading_kwargs()
    logger.info(f"Loading {path} ({config.get('model_type', '?')}, {kwargs['dtype']})")
    shared.processor = None
    shared.is_multimodal = is_image_text_config(config)
    if config.get("model_type") == "llava_llama":
        model = load_llava_llama(path, config, kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
    elif shared.is_multimodal:
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        shared.processor = load_processor(path)
        tokenizer = shared.processor.tokenizer if shared.processor is not None else \
            AutoTokenizer.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
        if getattr(tokenizer, "chat_template", None) is None and shared.processor is not None:
            tokenizer.chat_template = getattr(shared.processor, "chat_template", None)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
    if not use_cuda():
        model = model.to("cpu")
    model.eval()
    shared.settings["truncation_length"] = context_length(model, shared.settings["truncation_length"])
    model_settings.apply(path.name)
    return model, tokenizer


def load_processor(path: Path):
    """The folder's AutoProcessor, or None when it cannot load here (e.g. its video processor needs torchvision)."""
    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
    except (OSError, ImportError, ValueError, TypeError) as error:
        logger.info(f"The folder's AutoProcessor does not load here ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:160]}); the multimodal extension builds it from the folder's parts")
        return None


def context_length(model, default: int) -> int:
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text_config, "max_position_embeddings", None) or default)


def unload_model() -> None:
    shared.model = shared.tokenizer = shared.processor = None
    shared.is_multimodal = False
    shared.model_name = "None"
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def model_device() -> torch.device:
    """Where input ids and embeddings for the loaded model go (its input embedding's device)."""
    return shared.model.get_input_embeddings().weight.device
