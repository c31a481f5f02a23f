"""Loading fixture models and extensions into the host the way server.py does, and undoing it."""
from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path

from modules import chat, extensions, logits_processor_loader, model_settings, models, prefix_cache, shared


def snapshot() -> dict:
    return {"args": copy.deepcopy(shared.args), "settings": copy.deepcopy(shared.settings),
            "user_setting_keys": set(shared.user_setting_keys),
            "model": (shared.model, shared.tokenizer, shared.model_name, shared.is_multimodal),
            "logits_processors": shared.logits_processors, "engine": shared.engine}


def restore(saved: dict) -> None:
    shared.args = saved["args"]
    shared.settings.clear()
    shared.settings.update(saved["settings"])
    shared.user_setting_keys.clear()
    shared.user_setting_keys.update(saved["user_setting_keys"])
    model_settings.applied.clear()
    shared.model, shared.tokenizer, shared.model_name, shared.is_multimodal = saved["model"]
    shared.logits_processors = saved["logits_processors"]
    shared.engine = saved["engine"]
    shared.stop_everything = False
    extensions.reset()
    prefix_cache.clear()
    # Extensions keep module-level params: drop them so the next test imports them fresh.
    for name in [m for m in sys.modules if m.startswith("extensions.")]:
        del sys.modules[name]


def load(model_dir: Path, extension_names: list[str] | None = None, argv: list[str] | None = None,
         settings: dict | None = None, logits_processors: list | None = None) -> None:
    """`server.py`'s start-up for a model folder: the logits processor classes (`--logits-processors` in
    `argv`, `logits_processors` given as in `server.main`, installed entry points), the model, the
    extensions, then the processors."""
    shared.args = shared.parse_args((argv or []) + ["--model", str(model_dir)] +
                                    (["--extensions", *extension_names] if extension_names else []))
    shared.settings.update(settings or {})
    shared.user_setting_keys.update(settings or {})  # as if from the user's settings file
    classes = logits_processor_loader.requested_classes(shared.args.logits_processors, logits_processors or [])
    shared.model, shared.tokenizer = models.load_model(str(model_dir))
    shared.model_name = Path(model_dir).name
    extensions.load_extensions()
    shared.logits_processors = logits_processor_loader.build_runner(classes)


def greedy_state(**overrides) -> dict:
    """`chat.new_state` for 8 greedy tokens with seed 0, then `overrides` (a `history` among them)."""
    history = overrides.pop("history", None)
    return chat.new_state(history, **{"do_sample": False, "max_new_tokens": 8, "seed": 0, **overrides})


def import_fresh(module: str):
    sys.modules.pop(module, None)
    return importlib.import_module(module)


def hf_continuation(model_dir: Path, prompt: str, max_new_tokens: int, seed: int = 0, **decoding) -> str:
    """Hugging Face's own `generate` on a model folder loaded as is, the reference side of a comparison:
    the decoded text after `prompt`, `max_new_tokens` long (EOS is banned), with `decoding`'s arguments,
    the random generator seeded with `seed` just before (as the host seeds a request's)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    transformers.set_seed(seed)
    output = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                            suppress_tokens=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id, **decoding)
    return tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True)


def hf_processor():
    """Hugging Face's own processor for the served folder, loaded as is (the reference side of a comparison)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(shared.model.config._name_or_path)
