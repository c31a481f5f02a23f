"""Finding and loading a multimodal pipeline from the pipeline modules.

A pipeline module is a folder `pipelines/<dir>/` holding `pipelines.py` (no `__init__.py` needed,
hyphens allowed: it is `git clone`d there). It is imported as
`extensions.multimodal.pipelines.<dir>.pipelines`, so relative imports inside it work. It offers
`available_pipelines: List[str]`, `get_pipeline(name, params)` and optionally
`get_pipeline_from_model_name(model_name, params)` (see DOCS.md). The extension's own modules
(`BUILT_IN`: `hf_auto`, `llava`) come first, in that order, then third-party ones by folder name.
A module may also offer optional module-level capabilities, which `module_capability` finds:
`serves(model)` (an image-text checkpoint it generates for where the host cannot) and
`register_auto_classes()` (text-generation-webui's `AutoModelForCausalLM` loads its families whole).

`load_pipeline(params)` returns `(pipeline, module_dir_name)`: the pipeline named by
`--multimodal-pipeline` (hosts that have the flag), else by the `multimodal-pipeline` setting
(`params['pipeline']`), else the first one a module recognises from the model; otherwise a
RuntimeError listing every available pipeline. A module that fails to import is logged with its
traceback and skipped. This module does not construct models itself; the pipeline modules do.
"""
from __future__ import annotations

import importlib
import traceback
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Sequence, Tuple

from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline
from extensions.multimodal.core.folder_packages import register_package
from modules import shared
from modules.logging_colors import logger

PACKAGE = "extensions.multimodal.pipelines"
BUILTIN_PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
MODULE_FILE = "pipelines.py"
BUILT_IN = ("hf_auto", "llava")  # this extension's own pipeline modules, in this order before the others


def pipeline_roots(params: dict) -> List[Path]:
    """The built-in `pipelines/` folder, then any folders in `params['pipeline_dirs']`."""
    extra = params.get("pipeline_dirs") or []
    if isinstance(extra, (str, Path)):
        extra = [extra]
    return [BUILTIN_PIPELINES_DIR] + [Path(p).expanduser().resolve() for p in extra]


def find_module_dirs(roots: Sequence[Path]) -> List[Path]:
    """Each `<root>/<dir>/pipelines.py` folder, sorted by name within a root; a name seen twice keeps the first."""
    found: dict[str, Path] = {}
    for root in roots:
        if not Path(root).is_dir():
            logger.warning(f"Multimodal: pipeline folder {root} does not exist")
            continue
        for directory in sorted(Path(root).iterdir()):
            if not (directory / MODULE_FILE).is_file():
                continue
            if "." in directory.name:  # a dot would make it a nested package name
                logger.warning(f"Multimodal: pipeline module folder {directory} is skipped: rename it without '.'")
                continue
            if directory.name in found:
                logger.warning(f"Multimodal: pipeline module '{directory.name}' in {root} is skipped: "
                               f"{found[directory.name]} has the same name")
                continue
            found[directory.name] = directory
    built_in = [found[name] for name in BUILT_IN if name in found and found[name].parent == BUILTIN_PIPELINES_DIR]
    return built_in + [directory for directory in found.values() if directory not in built_in]


def import_pipeline_modules(roots: Sequence[Path]) -> List[ModuleType]:
    """Import every pipeline module; one that raises is logged with its traceback and skipped."""
    modules = []
    for directory in find_module_dirs(roots):
        package = f"{PACKAGE}.{directory.name}"
        register_package(package, [directory])
        try:
            modules.append(importlib.import_module(f"{package}.pipelines"))
        except Exception:  # third-party code: one broken module must not hide the others
            logger.error(f"Multimodal: failed to import the pipeline module '{directory.name}' "
                         f"({directory / MODULE_FILE}), skipping it:\n{traceback.format_exc()}")
    return modules


def module_capability(params: dict, name: str):
    """The first pipeline module's optional module-level capability `name`, or None when none offers it."""
    for module in import_pipeline_modules(pipeline_roots(params)):
        capability = getattr(module, name, None)
        if capability is not None:
            return capability
    return None


def module_dir_name(module: ModuleType) -> str:
    return module.__name__[len(PACKAGE) + 1:-len(".pipelines")]


def available_pipelines(modules: Sequence[ModuleType]) -> List[str]:
    names: List[str] = []
    for module in modules:
        names.extend(str(name) for name in getattr(module, "available_pipelines", []))
    return names


def load_pipeline(params: dict) -> Tuple[AbstractMultimodalPipeline, str]:
    """The pipeline to use and the folder name of the module that provided it, from the folders
    `pipeline_roots(params)` names."""
    modules = import_pipeline_modules(pipeline_roots(params))
    requested = requested_pipeline(params)
    if requested is not None:
        found = first_pipeline(modules, "get_pipeline", requested, params)
        if found is not None:
            return found
        raise RuntimeError(f"Multimodal pipeline '{requested}' not found. {describe_available(modules)}")
    model_name = str(shared.model_name).lower()
    found = first_pipeline(modules, "get_pipeline_from_model_name", model_name, params)
    if found is not None:
        return found
    raise RuntimeError(f"No multimodal pipeline recognises the model '{shared.model_name}', so none was picked "
                       f"automatically. {how_to_name_one()} {describe_available(modules)}")


def requested_pipeline(params: dict) -> Optional[str]:
    """The pipeline the user named: `--multimodal-pipeline` where the host has that flag (today's
    text-generation-webui does not), else the `multimodal-pipeline` setting."""
    return getattr(shared.args, "multimodal_pipeline", None) or params.get("pipeline") or None


def how_to_name_one() -> str:
    setting = "set `multimodal-pipeline: NAME` in the settings file"
    if hasattr(shared.args, "multimodal_pipeline"):
        return f"Start with --multimodal-pipeline NAME, or {setting}."
    return f"Name one: {setting} (this host has no --multimodal-pipeline flag)."


def first_pipeline(modules: Sequence[ModuleType], function_name: str, name: str,
                   params: dict) -> Optional[Tuple[AbstractMultimodalPipeline, str]]:
    for module in modules:
        function = getattr(module, function_name, None)
        if function is None:  # get_pipeline_from_model_name is optional
            continue
        pipeline = function(name, params)
        if pipeline is not None:
            pipeline = with_contract_defaults(pipeline)
            logger.info(f"Multimodal: using the pipeline '{pipeline.name()}' from pipelines/{module_dir_name(module)}")
            return pipeline, module_dir_name(module)
    return None


def with_contract_defaults(pipeline) -> AbstractMultimodalPipeline:
    """`pipeline`, an `AbstractMultimodalPipeline`. One of a class that does not subclass it (written
    against the original's eight methods alone) is given the contract's defaults for the rest here, once,
    so the extension calls every method of the contract without guards: its class becomes a subclass of
    its own class and the contract (its methods first; its name, module and attributes unchanged)."""
    if isinstance(pipeline, AbstractMultimodalPipeline):
        return pipeline
    cls = type(pipeline)
    pipeline.__class__ = type(cls.__name__, (cls, AbstractMultimodalPipeline),
                              {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return pipeline


def describe_available(modules: Sequence[ModuleType]) -> str:
    names = available_pipelines(modules)
    if not names:
        return (f"No pipelines are available: add a pipeline module to {BUILTIN_PIPELINES_DIR} "
                f"(see extensions/multimodal/DOCS.md), and check the log for modules that failed to import.")
    return f"Available pipelines: {', '.join(names)}."
