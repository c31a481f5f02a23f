"""Packages made from folders, so code in a folder without `__init__.py` imports under a fixed name.

The extension itself needs it where a host loads `script.py` by its path (today's
text-generation-webui, from `user_data/extensions/`); pipeline modules need it because they are
`git clone`d into `pipelines/<dir>/`. Only the standard library is imported here: `script.py`
loads this file by its path, before the package it belongs to exists.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Sequence


def register_package(name: str, directories: Sequence[Path], replace: bool = False) -> None:
    """Make `name` a package whose submodules are read from `directories`.

    A package already imported from the same folders keeps its modules (and so its classes), unless
    `replace`; any other same-named package is dropped with its submodules, which must not mix.
    """
    existing = sys.modules.get(name)
    wanted = [Path(d).resolve() for d in directories]
    if not replace and existing is not None and \
            [Path(p).resolve() for p in getattr(existing, "__path__", [])] == wanted:
        return
    for module_name in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module_name]
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(d) for d in wanted]
    sys.modules[name] = importlib.util.module_from_spec(spec)
