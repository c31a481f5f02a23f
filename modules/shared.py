"""Process-wide state shared by the host and its extensions, under text-generation-webui's names.

Holds the parsed command line (`args`), the generation settings (`settings`), the loaded model
and tokenizer, and the Gradio components (`gradio`). Importing this module reads
neither `sys.argv` nor any file: `server.py` parses the real command line and loads settings.
"""
from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
# The small model the repository ships, so `python server.py` with no flags starts a working demo.
DEMO_MODEL = "tiny-llava-shapes"

model: Any = None
tokenizer: Any = None
NO_MODEL_MESSAGE = "No model is loaded: start the server with --model NAME (see models/README.md)."
is_multimodal: bool = False  # the loaded model is an image-text model (text-generation-webui's name)
model_name: str = "None"
gradio: dict[str, Any] = {}
# The batch-level logits processors (a modules.logits_bridge.LogitsProcessorRunner), built once at
# start-up by server.py; None when none are loaded.
logits_processors: Any = None

# The remote engine that generates replies (a modules.engine.RemoteEngine), or None: the local model.
engine: Any = None
# The local model generates one reply at a time, for the UI and the API alike.
generation_lock = threading.Lock()
stop_everything = False
# A generation's own stop: `state[STOP_EVENT]`, a threading.Event the UI sets from the session's Stop button
# (`text_generation.stop_requested` reads it).
STOP_EVENT = "stop_event"
processing_message = "*Is typing...*"

# Every generation parameter lives here, so `dict(settings)` plus overrides is a valid `state`.
default_settings: dict[str, Any] = {
    "max_new_tokens": 512,
    "truncation_length": 2048,
    "add_bos_token": True,
    "ban_eos_token": False,
    "skip_special_tokens": True,
    "custom_stopping_strings": "",
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 0,
    "repetition_penalty": 1.0,
    "seed": -1,
    "stream": True,
    # text-generation-webui's "Maximum UI updates/second" (its 598568b1 setting; 0: every token at once).
    # Here it holds for every reply the local model streams, to the UI and the API alike: each update's
    # Python (decoding, the chat's history, a chunk) holds the GIL that the generating thread needs
    # between a step's kernels, so an update a token slows the decode of a fast model (a GPU's compiled
    # step takes a few milliseconds; bench/decode.py --size micro measures it). 50 a second is smoother
    # than the eye follows, and slower replies still arrive token by token.
    "max_updates_second": 50,
    "system_message": "",
    "default_extensions": [],
    "model": DEMO_MODEL,
    "prefix_cache": True,
    # Decode with a static KV cache (modules/static_decode.py): None = --static-cache, else its default.
    "static_cache": None,
    # Per-request arguments for the loaded logits processors (their `RequestParams.extra_args`).
    "logits_processor_args": {},
}
settings: dict[str, Any] = dict(default_settings)
# Keys the user's settings file set: per-model settings (models/config.yaml) do not override them.
user_setting_keys: set[str] = set()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="A text-generation-webui-compatible chat host with the multimodal extension.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=40),
    )
    group = parser.add_argument_group("Model")
    group.add_argument("--model", type=str, help="Model folder name under --model-dir, or a path to one.")
    group.add_argument("--model-dir", type=str, default="models/", help="Where model folders live (default: models/).")
    group.add_argument("--cpu", action="store_true", help="Load and run on the CPU even when CUDA is present, in float32 (without it, the CPU loads the dtype the checkpoint is saved in, as Hugging Face does).")
    group.add_argument("--bf16", action="store_true", help="Load in bfloat16, whatever the checkpoint is saved in.")
    group.add_argument("--load-in-8bit", action="store_true", help="8-bit weights through bitsandbytes (CUDA only).")
    group.add_argument("--load-in-4bit", action="store_true", help="4-bit weights through bitsandbytes (CUDA only).")
    group.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the model folder.")
    group.add_argument("--no-prefix-cache", action="store_true",
                       help="Do not reuse the previous generation's KV cache for a shared prompt prefix.")
    group.add_argument("--static-cache", action="store_true",
                       help="Decode with a static KV cache, which transformers compiles on CUDA (llava-hf, "
                            "LLaVA-NeXT/OneVision, Qwen2.5-VL and Gemma 3; other families keep the dynamic one). "
                            "On by default on a CUDA device where it compiles; this flag turns it on elsewhere. "
                            "The static_cache setting (true/false) overrides both.")

    group.add_argument("--cudnn-attention", action="store_true",
                       help="Keep cuDNN's attention backend on CUDA. Off by default: it builds a plan for each "
                            "new sequence length, so eager decoding waits at every step of a new reply "
                            "(README, \"On an H200\").")

    group = parser.add_argument_group("Engine")
    group.add_argument("--engine-url", type=str, default=None, metavar="URL",
                       help="Generate through a running vLLM server's OpenAI-compatible API, e.g. "
                            "http://127.0.0.1:8000/v1 (started with --trust-request-chat-template). --model then "
                            "names the served model (default: the one it serves); its folder under --model-dir "
                            "needs its config, tokenizer and processor files, not its weights.")
    group.add_argument("--engine-api-key", type=str, default="", metavar="KEY",
                       help="The key the engine was started with (vLLM's --api-key), sent as 'Authorization: Bearer KEY'.")
    group.add_argument("--engine-timeout", type=float, default=120.0, metavar="SECONDS",
                       help="How long to wait for the engine's next piece of a reply (default: 120).")

    group = parser.add_argument_group("Extensions")
    group.add_argument("--extensions", type=str, nargs="+", default=[], help="Extensions to load, by folder name.")
    group.add_argument("--multimodal-pipeline", type=str, default=None,
                       help="The multimodal pipeline to use (implies --extensions multimodal).")
    group.add_argument("--settings", type=str, help="A YAML settings file (default: settings.yaml when present).")
    group.add_argument("--logits-processors", type=str, nargs="+", default=[], metavar="MODULE:CLASS",
                       help="Batch-level logits processors to load, as module.path:ClassName (installed "
                            "'textgen.logits_processors' entry points load by themselves).")

    group = parser.add_argument_group("Server")
    group.add_argument("--listen", action="store_true", help="Listen on all interfaces, not only 127.0.0.1.")
    group.add_argument("--listen-host", type=str, help="The host name or address to bind the UI to.")
    group.add_argument("--listen-port", type=int, default=7860, help="The UI port (default: 7860).")
    group.add_argument("--nowebui", action="store_true", help="Do not start the Gradio UI (use with --api).")
    group.add_argument("--gradio-auth", type=str, default=None, metavar="USER:PWD",
                       help="Ask for a login on the UI: USER:PASSWORD, or several as U1:P1,U2:P2.")
    group.add_argument("--gradio-auth-path", type=str, default=None, metavar="FILE",
                       help="Read the UI's logins from FILE: USER:PASSWORD pairs, one per line or comma-separated.")

    group = parser.add_argument_group("API")
    group.add_argument("--api", action="store_true", help="Start the OpenAI-compatible API.")
    group.add_argument("--api-port", type=int, default=5000, help="The API port (default: 5000).")
    group.add_argument("--api-key", type=str, default="", help="Require 'Authorization: Bearer KEY' on API requests.")
    group.add_argument("--api-allow-private-urls", action="store_true",
                       help="Let the API and extensions (modules.web_search.safe_get) fetch URLs on loopback, private and link-local addresses.")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse a command line and apply the implications text-generation-webui applies."""
    parsed = build_parser().parse_args(argv)
    if parsed.multimodal_pipeline is not None and "multimodal" not in parsed.extensions:
        parsed.extensions.append("multimodal")
    return parsed


args = parse_args([])


def load_settings(path: str | Path | None = None) -> Path | None:
    """Update `settings` from a YAML file: `path`, else `settings.yaml` at the root when present.

    Returns the file used, or None. Keys named `EXT-param` are applied to extensions when they load.
    """
    if path is None:
        candidate = ROOT / "settings.yaml"
        if not candidate.exists():
            return None
        path = candidate
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        loaded = yaml.safe_load(f) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a settings file must hold a YAML mapping, got {type(loaded).__name__}")
    settings.update(loaded)
    user_setting_keys.update(loaded)
    return path
