"""Loading a Hugging Face model folder into `shared.model` / `shared.tokenizer`.

`load_model(name)` picks the transformers Auto class from the folder's config.json:
- configs with a `vision_config` (LLaVA, Qwen2.5-VL, Gemma 3, ...) load with
  `AutoModelForImageTextToText` (`shared.is_multimodal`); their tokenizer takes the chat template
  the folder keeps for its processor when it has none of its own. The processor itself is the
  multimodal extension's to load, as in text-generation-webui (several need torchvision, which
  the extension works around);
- original LLaVA checkpoints (`model_type: llava_llama`) load as plain Llama causal LMs; their
  `model.mm_projector.*` tensors stay on disk for the multimodal pipeline to read;
- everything else loads with `AutoModelForCausalLM`.
With a remote engine, `load_without_weights(name)` loads all of that but the weights.
It does not build prompts or generate.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
from transformers.processing_utils import ProcessorMixin

from modules import attention_backend, model_settings, shared
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


def saved_dtype(config: dict[str, Any]) -> torch.dtype | None:
    """The dtype a folder's config.json says its weights are in (today's `dtype` or the older
    `torch_dtype`, at the top or in `text_config`); None when it says none."""
    for section in (config, config.get("text_config") or {}):
        name = section.get("dtype") or section.get("torch_dtype")
        if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
    return None


def pick_dtype(config: dict[str, Any]) -> torch.dtype:
    """bfloat16 with --bf16. CUDA: the checkpoint's float16 or bfloat16, else float16. CPU: float32
    with --cpu (as text-generation-webui's --cpu; most CPUs multiply it fastest), else the dtype the
    checkpoint is saved in, which is what Hugging Face's `from_pretrained` loads by default: a hub
    folder saved in bfloat16 then gives Hugging Face's tokens, not float32's."""
    if shared.args.bf16:
        return torch.bfloat16
    saved = saved_dtype(config)
    if use_cuda():
        return saved if saved in (torch.float16, torch.bfloat16) else torch.float16
    return torch.float32 if shared.args.cpu or saved is None else saved


def use_cuda() -> bool:
    return torch.cuda.is_available() and not shared.args.cpu


def quantization_config(dtype: torch.dtype) -> transformers.BitsAndBytesConfig | None:
    if not (shared.args.load_in_8bit or shared.args.load_in_4bit):
        return None
    if not use_cuda():
        raise ValueError("--load-in-8bit and --load-in-4bit need CUDA (bitsandbytes); this machine runs on the CPU. "
                         "Drop the flag to load full-precision weights.")
    if shared.args.load_in_4bit:
        return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
    return transformers.BitsAndBytesConfig(load_in_8bit=True)


def loading_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    dtype = pick_dtype(config)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": shared.args.trust_remote_code}
    if use_cuda():
        kwargs["device_map"] = "auto"  # accelerate places the layers
    quant = quantization_config(dtype)
    if quant is not None:
        kwargs["quantization_config"] = quant
    return kwargs


def load_llava_llama(path: Path, config: dict[str, Any], kwargs: dict[str, Any]):
    # Original LLaVA releases: a Llama LM whose folder also carries mm_projector (and sometimes
    # vision tower) tensors. transformers knows no `llava_llama` type (text-generation-webui #4692).
    llama_config = transformers.LlamaConfig.from_dict({**config, "model_type": "llama"})
    return AutoModelForCausalLM.from_pretrained(path, config=llama_config, **kwargs)


def load_model(model_name: str):
    """Load a model folder; returns `(model, tokenizer)`."""
    path = resolve_model_path(model_name)
    config = read_config_dict(path)
    kwargs = loading_kwargs(config)
    logger.info(f"Loading {path} ({config.get('model_type', '?')}, {kwargs['dtype']})")
    shared.is_multimodal = is_image_text_config(config)
    if config.get("model_type") == "llava_llama":
        model = load_llava_llama(path, config, kwargs)
    elif shared.is_multimodal:
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = load_tokenizer(path)
    if not use_cuda():
        model = model.to("cpu")
    attention_backend.choose(use_cuda())
    model.eval()
    take_context_length(model)
    model_settings.apply(path.name)
    return model, tokenizer


def engine_model_folder(served_name: str) -> Path:
    """The folder for a model an engine serves under `served_name`: that name under --model-dir or as a
    path (vLLM serves a folder under the path it was given), else its last part under --model-dir
    (`llava-hf/llava-1.5-7b-hf` -> `models/llava-1.5-7b-hf`)."""
    try:
        return resolve_model_path(served_name)
    except FileNotFoundError:
        last = Path(served_name).name
        try:
            return resolve_model_path(last)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"The engine serves {served_name!r}, but no folder {Path(shared.args.model_dir) / last} holds its "
                f"config, tokenizer and processor files, which the host needs to build prompts (not its weights): "
                f"e.g. huggingface-cli download {served_name} --exclude '*.safetensors' '*.bin' "
                f"--local-dir {Path(shared.args.model_dir) / last}") from None


def load_without_weights(model_name: str):
    """For a host whose replies come from a remote engine: the model's structure, config and tokenizer,
    its weights left out (the engine holds them). Returns `(model, tokenizer)` as `load_model` does.

    The prompt is still built here: the chat template, the tokenizer and the extension's picture costs
    need the folder's config, tokenizer and processor files, not the weights. The model is built on
    PyTorch's meta device, which allocates nothing; its input embedding alone is a real tensor, one
    value broadcast to the embedding's shape, so code that asks where the model takes its inputs
    (`model_device`) hears the CPU. Nothing runs it."""
    path = resolve_model_path(model_name)
    config = read_config_dict(path)
    shared.is_multimodal = is_image_text_config(config)
    auto_config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
    model_class = AutoModelForImageTextToText if shared.is_multimodal else AutoModelForCausalLM
    with torch.device("meta"):
        model = model_class.from_config(auto_config, trust_remote_code=shared.args.trust_remote_code)
    embedding = model.get_input_embeddings()
    embedding.weight = torch.nn.Parameter(torch.zeros(1).expand(embedding.weight.shape), requires_grad=False)
    model.eval()
    tokenizer = load_tokenizer(path)
    take_context_length(model)
    model_settings.apply(path.name)
    return model, tokenizer


def load_tokenizer(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=shared.args.trust_remote_code)
    if shared.is_multimodal and getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_template = processor_chat_template(path)
    return tokenizer


def processor_chat_template(path: Path) -> str | None:
    """The chat template an image-text folder keeps for its processor (chat_template.jinja or the
    older chat_template.json), read by transformers' own processor-config reader."""
    try:
        processor_dict, _ = ProcessorMixin.get_processor_dict(str(path))
    except (OSError, ValueError) as error:
        logger.info(f"No processor chat template in {path}: {type(error).__name__}: {str(error)[:160]}")
        return None
    return processor_dict.get("chat_template")


def take_context_length(model) -> None:
    """The model's context as `truncation_length`, as text-generation-webui's loaders set it, unless the
    user's settings file sets one: that wins, as it wins over the models folders' config files."""
    if "truncation_length" not in shared.user_setting_keys:
        shared.settings["truncation_length"] = context_length(model, shared.settings["truncation_length"])


def context_length(model, default: int) -> int:
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text_config, "max_position_embeddings", None) or default)


def model_device() -> torch.device:
    """Where input ids and embeddings for the loaded model go (its input embedding's device)."""
    return shared.model.get_input_embeddings().weight.device
