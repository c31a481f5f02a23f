"""Per-model default settings, text-generation-webui's way.

`models/config.yaml` (shipped) and then `models/config-user.yaml` (yours; both under `--model-dir`)
map a regular expression, matched against the start of the lower-cased model folder name, to
settings, e.g.

    .*tiny-llava-shapes:
      multimodal-add_all_images_to_prompt: true

`apply(name)` puts the matching settings into `shared.settings` when a model loads, except keys the
user's own settings file set (`shared.user_setting_keys`): those win. Settings applied for the
previous model are taken back first. It does not load models or extensions.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from modules import shared
from modules.logging_colors import logger

CONFIG_FILES = ("config.yaml", "config-user.yaml")
ABSENT = object()
applied: dict[str, Any] = {}  # key -> the value it had before the model's settings replaced it (or ABSENT)


def config_folders() -> list[Path]:
    folder = Path(shared.args.model_dir)
    folders = [folder]
    if not folder.is_absolute():
        folders.append(shared.ROOT / folder)
    return list(dict.fromkeys(p.resolve() for p in folders if p.is_dir()))


def read_config(path: Path) -> dict[str, dict]:
    with path.open(encoding="utf-8") as f:
        loaded = yaml.safe_load(f) or {}
    if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
        raise ValueError(f"{path}: expected a mapping of name patterns to settings mappings")
    return loaded


def settings_for(model_name: str) -> dict[str, Any]:
    """The settings every matching pattern gives, later files and later patterns winning."""
    found: dict[str, Any] = {}
    for folder in config_folders():
        for file_name in CONFIG_FILES:
            path = folder / file_name
            if not path.exists():
                continue
            for pattern, values in read_config(path).items():
                if re.match(str(pattern).lower(), model_name.lower()):
                    found.update(values)
    return found


def apply(model_name: str) -> dict[str, Any]:
    """Replace the previous model's settings with this model's; returns what was applied."""
    for key, before in applied.items():
        if before is ABSENT:
            shared.settings.pop(key, None)
        else:
            shared.settings[key] = before
    applied.clear()
    chosen = {k: v for k, v in settings_for(model_name).items() if k not in shared.user_setting_keys}
    for key, value in chosen.items():
        applied[key] = shared.settings.get(key, ABSENT)
        shared.settings[key] = value
    if chosen:
        logger.info(f"Settings for {model_name} from the models folders' config files: {chosen}")
    return chosen
