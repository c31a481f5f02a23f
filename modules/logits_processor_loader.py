"""Finding and constructing the logits processors, once, at start-up.

Three ways in, in this order (a class named twice is loaded once):
1. class paths `module.path:ClassName` (`--logits-processors`, or strings in `server.main(...,
   logits_processors=[...])`);
2. class objects passed in Python (`server.main(argv, logits_processors=[MyProcessor])`);
3. every entry point of the group `textgen.logits_processors` in the installed packages.
Extensions add theirs last: a loaded extension's module-level `logits_processors` list of classes.
`requested_classes` resolves 1-3 before the model loads, so a wrong name fails start-up at once
with `LogitsProcessorLoadError` (a ValueError) saying what is wrong and how to fix it;
`build_runner` constructs every class with the host's config once the model and extensions are loaded.
"""
from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Iterable, Sequence, Union

import torch

from modules import shared
from modules.extensions import iterator as loaded_extensions
from modules.logging_colors import logger
from modules.logits_bridge import LogitsProcessorRunner, class_name
from modules.logits_processors import HostConfig, LogitsProcessor
from modules.models import model_device

ENTRY_POINT_GROUP = "textgen.logits_processors"
ProcessorSpec = Union[str, type]


class LogitsProcessorLoadError(ValueError):
    """A processor that cannot be loaded: a wrong class path, a class of the wrong kind, a failing constructor."""


def resolve(spec: ProcessorSpec, origin: str = "--logits-processors") -> type[LogitsProcessor]:
    """A class path `module.path:ClassName` or a class -> a checked LogitsProcessor subclass."""
    if isinstance(spec, str):
        return check_class(import_class(spec, origin), f"{origin} {spec}")
    return check_class(spec, f"{origin}[{spec!r}]")


def import_class(path: str, origin: str) -> object:
    label = f"{origin} {path}"
    module_name, colon, attribute = path.partition(":")
    if not colon or not module_name or not attribute:
        raise LogitsProcessorLoadError(f"{label}: not a class path; write it as module.path:ClassName, "
                                       f"e.g. examples.target_token:TargetTokenLogitsProcessor")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # The module itself (or a parent package) is missing, rather than something it imports.
        missing_itself = error.name is not None and f"{module_name}.".startswith(f"{error.name}.")
        where = "" if missing_itself else f" (while importing it: {error})"
        raise LogitsProcessorLoadError(f"{label}: cannot import module '{module_name}'{where}; check the spelling "
                                       f"and that it is on the Python path or installed") from error
    except Exception as error:
        raise LogitsProcessorLoadError(f"{label}: importing module '{module_name}' failed: "
                                       f"{type(error).__name__}: {error}") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        found = processor_classes_in(module)
        raise LogitsProcessorLoadError(
            f"{label}: module '{module_name}' has no '{attribute}'; its LogitsProcessor classes: "
            f"{', '.join(found) or 'none'}") from None


def processor_classes_in(module) -> list[str]:
    return sorted(name for name, value in vars(module).items() if inspect.isclass(value)
                  and issubclass(value, LogitsProcessor) and value.__module__ == module.__name__)


def check_class(value: object, label: str) -> type[LogitsProcessor]:
    if not inspect.isclass(value):
        raise LogitsProcessorLoadError(f"{label}: is a {type(value).__name__}, not a class; give a subclass of "
                                       f"modules.logits_processors.LogitsProcessor")
    if not issubclass(value, LogitsProcessor):
        raise LogitsProcessorLoadError(f"{label}: {value.__qualname__} does not subclass "
                                       f"modules.logits_processors.LogitsProcessor (or AdapterLogitsProcessor)")
    return value


def entry_point_classes() -> list[type[LogitsProcessor]]:
    """Every installed `textgen.logits_processors` entry point, by name."""
    classes = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else "an installed package"
        origin = f"entry point '{point.name}' of {package} (group {ENTRY_POINT_GROUP})"
        try:
            value = point.load()
        except Exception as error:
            raise LogitsProcessorLoadError(f"{origin}: loading {point.value} failed: {type(error).__name__}: {error}; "
                                           f"fix or uninstall {package}") from error
        classes.append(check_class(value, f"{origin} {point.value}"))
    return classes


def requested_classes(class_paths: Sequence[str] = (), class_objects: Sequence[ProcessorSpec] = (),
                      use_entry_points: bool = True) -> list[type[LogitsProcessor]]:
    classes = [resolve(path) for path in class_paths]
    classes += [resolve(spec, "logits_processors=") for spec in class_objects]
    if use_entry_points:
        classes += entry_point_classes()
    return unique(classes)


def extension_classes() -> list[type[LogitsProcessor]]:
    classes = []
    for extension, name in loaded_extensions():
        for value in getattr(extension, "logits_processors", None) or []:
            classes.append(check_class(value, f"extension {name}'s logits_processors[{value!r}]"))
    return classes


def unique(classes: Iterable[type]) -> list[type]:
    seen: dict[type, None] = {}
    for cls in classes:
        if cls in seen:
            logger.info(f"Logits processor {class_name(cls)} is named more than once; loading it once")
        seen.setdefault(cls, None)
    return list(seen)


def host_config() -> HostConfig:
    model_config = getattr(shared.model, "config", None)
    return HostConfig(args=shared.args, settings=shared.settings, model_config=model_config, tokenizer=shared.tokenizer)


def processor_device() -> torch.device:
    return torch.device("cpu") if shared.model is None else model_device()


def build_runner(classes: Sequence[type[LogitsProcessor]]) -> LogitsProcessorRunner | None:
    """Constructs `classes` plus the loaded extensions' processors; None when there are none."""
    classes = unique(list(classes) + extension_classes())
    if not classes:
        return None
    device = processor_device()
    is_pin_memory = torch.cuda.is_available() and device.type == "cuda"
    config = host_config()
    processors = []
    for cls in classes:
        try:
            processors.append(cls(config, device, is_pin_memory))
        except Exception as error:
            raise LogitsProcessorLoadError(f"Constructing logits processor {class_name(cls)} failed: "
                                           f"{type(error).__name__}: {error}") from error
    logger.info(f"Logits processors: {', '.join(class_name(cls) for cls in classes)}")
    return LogitsProcessorRunner(processors)
