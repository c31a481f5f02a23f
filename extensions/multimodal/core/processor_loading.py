"""A checkpoint's own processor, with or without torchvision (`loaded_model.processor()` loads it
once per model, in every host).

`load_processor(folder)` returns the processor the checkpoint ships (tokenizer, image processor, chat
template, processor settings):
- `AutoProcessor.from_pretrained(folder)`, as is, wherever it loads (with torchvision, and for the
  families whose processor needs none: LLaVA, Gemma 3, Idefics3, Aya Vision, ...);
- otherwise the same processor class built from the checkpoint's own parts: its PIL image processor
  (`*ImageProcessorPil`, from the folder's saved image-processor config), its tokenizer, its chat
  template and processor settings, and no video processor. Images only: video needs torchvision.

Why the second route is needed in transformers 5.23 (measured; tests/test_processor_loading.py loads each):
`ProcessorMixin` refuses a missing video processor (its class check trips on
`VIDEO_PROCESSOR_MAPPING._extra_content`), and Qwen2-VL/2.5-VL/3-VL, SmolVLM, InternVL and
LLaVA-OneVision declare one whose class needs torchvision; `PixtralProcessor`'s module imports one
size helper from the torchvision image-processor module (the PIL module has the same helper);
SmolVLM's `apply_chat_template` reads the video processor's frame settings even for images.
In transformers 5.6 (text-generation-webui's pin) `AutoImageProcessor` itself needs torchvision and
cannot read the image-processor settings that newer versions save inside processor_config.json: the
PIL image processor is then found by its class name (`pil_image_processor_by_name`).

Nothing here changes transformers for anyone else (a same-name subclass declares no video processor;
Pixtral's module loads under a private name). A failure raises `ProcessorLoadError` naming the fix.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.processing_utils import ProcessorMixin

from modules.logging_colors import logger

INSTALL_TORCHVISION = ("install torchvision built for your torch (e.g. `pip install torchvision` on a CUDA "
                       "machine), which lets the checkpoint's processor load as is")
# Pure-Python packages some processors import; the fix is named in the error.
EXTRA_PACKAGES = {"SmolVLMProcessor": "num2words"}


class ProcessorLoadError(RuntimeError):
    """The checkpoint's processor cannot be built here; the message says why and what to install."""


@functools.cache
def torchvision_usable() -> bool:
    """True when torchvision imports and its compiled ops load (an install built for another torch fails)."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return False
    try:
        import torchvision  # noqa: F401  (registers its C++ ops: fails on a mismatched torch)
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def load_processor(folder: str | Path, use_torchvision: bool | None = None) -> ProcessorMixin:
    """The checkpoint's processor (see the module docstring for the two routes).

    `use_torchvision` None: `AutoProcessor` when it loads here, else the parts route; False: the parts route."""
    folder = Path(folder)
    if use_torchvision is False:
        return processor_from_parts(folder)
    try:
        return AutoProcessor.from_pretrained(folder)
    except (OSError, ImportError, ValueError, TypeError, AttributeError) as error:
        # A folder saved where torchvision was missing holds no video processor, which AutoProcessor then
        # requires wherever torchvision is installed (seen on an H200): its pictures still need only the parts.
        no_video = isinstance(error, OSError) and "video processor" in str(error)
        if (use_torchvision or torchvision_usable()) and not no_video:
            raise
        first_line = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        logger.info(f"Multimodal: AutoProcessor does not load {'this folder' if no_video else 'without torchvision'} "
                    f"({type(error).__name__}: {first_line}); building it from the checkpoint's PIL parts")
        return processor_from_parts(folder, images_only=no_video)


def processor_from_parts(folder: Path, images_only: bool = False) -> ProcessorMixin:
    """The checkpoint's processor class built from its PIL image processor, tokenizer and settings
    (`images_only`: without its video processor even where torchvision could run one)."""
    cls = processor_class(folder_processor_class_name(folder), images_only)
    image_processor = pil_image_processor(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor_dict, instantiation_kwargs = cls.get_processor_dict(folder)
    parts = {"image_processor": image_processor, "tokenizer": tokenizer}
    missing = [name for name in processor_attributes(cls) if name not in parts]
    if missing:
        raise ProcessorLoadError(f"{cls.__name__} needs {', '.join(missing)}, which this loader does not build "
                                 f"without torchvision; {INSTALL_TORCHVISION}.")
    # Positional, in the order the class's __init__ declares them (a dropped video processor is None).
    args = [parts.get(name) for name in declared_attributes(cls)]
    try:
        return cls.from_args_and_dict(args, processor_dict, **instantiation_kwargs)
    except ImportError as error:
        raise ProcessorLoadError(f"{cls.__name__} could not be built: {error}{fix_hint(cls.__name__)}") from error


def pil_image_processor(folder: Path):
    """The checkpoint's image processor, PIL backend (no torchvision)."""
    try:
        return AutoImageProcessor.from_pretrained(folder, backend="pil")
    except ImportError:  # transformers 5.6: AutoImageProcessor is a placeholder without torchvision
        return pil_image_processor_by_name(folder)


def pil_image_processor_by_name(folder: Path):
    """`<Name>ImageProcessorPil` built from the folder's saved image-processor settings.

    Hub folders keep them in preprocessor_config.json; transformers 5.2x saves them under
    "image_processor" in processor_config.json. The class comes from its own module, since the
    top-level name is a torchvision placeholder in transformers 5.6.
    """
    settings = image_processor_settings(folder)
    type_name = settings.pop("image_processor_type", None)
    if not type_name:
        raise ProcessorLoadError(f"{folder} names no image_processor_type; {INSTALL_TORCHVISION}.")
    class_name = type_name.removesuffix("Fast").removesuffix("Pil") + "Pil"
    return pil_class(class_name).from_dict(settings)


def image_processor_settings(folder: Path) -> dict:
    preprocessor = folder / "preprocessor_config.json"
    if preprocessor.is_file():
        return json.loads(preprocessor.read_text())
    processor = folder / "processor_config.json"
    nested = json.loads(processor.read_text()).get("image_processor") if processor.is_file() else None
    if not isinstance(nested, dict):
        raise ProcessorLoadError(f"{folder} has no image-processor settings (preprocessor_config.json)")
    return dict(nested)


@functools.cache
def pil_class(class_name: str) -> type:
    """The transformers class `class_name` from the `image_processing_pil_*` module that defines it."""
    import transformers

    models = Path(transformers.__file__).parent / "models"
    for path in sorted(models.glob("*/image_processing_pil_*.py")):
        if f"class {class_name}(" in path.read_text(encoding="utf-8"):
            module = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
            return getattr(module, class_name)
    raise ProcessorLoadError(f"transformers {transformers.__version__} has no {class_name}; {INSTALL_TORCHVISION}.")


def processor_attributes(cls: type[ProcessorMixin]) -> list[str]:
    """The sub-processors a processor class takes: `get_attributes()` in transformers 5, the `attributes`
    list before it (text-generation-webui 598568b1 pins transformers 4.50)."""
    get_attributes = getattr(cls, "get_attributes", None)
    return list(get_attributes() if get_attributes is not None else cls.attributes)


def declared_attributes(cls: type[ProcessorMixin]) -> list[str]:
    """The sub-processors `cls.__init__` takes (`ProcessorMixin.get_attributes`, ignoring our override)."""
    if not hasattr(ProcessorMixin, "get_attributes"):
        return list(cls.attributes)  # transformers 4: a class list, which no override of ours replaces
    return ProcessorMixin.get_attributes.__func__(cls)


def fix_hint(class_name: str) -> str:
    package = EXTRA_PACKAGES.get(class_name)
    return f" (fix: pip install {package})" if package else f" (fix: {INSTALL_TORCHVISION})"


def folder_processor_class_name(folder: Path) -> str:
    """The processor class a checkpoint names (processor/preprocessor/tokenizer config), else its model type's."""
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            class_name = json.loads(path.read_text()).get("processor_class")
            if class_name:
                return class_name
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    config = folder / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if model_type not in PROCESSOR_MAPPING_NAMES:
        raise ProcessorLoadError(f"{folder} names no processor class (processor_config.json) and its model type "
                                 f"{model_type!r} has none in transformers; is it an image-text checkpoint?")
    return PROCESSOR_MAPPING_NAMES[model_type]


@functools.cache
def processor_class(class_name: str, images_only: bool = False) -> type[ProcessorMixin]:
    """The transformers processor class `class_name`, usable without torchvision (see the module docstring);
    `images_only`: without a video processor wherever it runs."""
    if class_name == "PixtralProcessor":
        cls = pixtral_processor_class()
    else:
        import transformers

        try:
            cls = getattr(transformers, class_name)
        except (AttributeError, ImportError) as error:
            raise ProcessorLoadError(f"transformers has no usable processor class {class_name}: {error}"
                                     f"{fix_hint(class_name)}") from error
    if "video_processor" in processor_attributes(cls) and (images_only or not torchvision_usable()):
        return without_video_processor(cls)
    return cls


def without_video_processor(cls: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """A subclass of `cls`, same name, that declares no video processor: `ProcessorMixin` pairs the
    family's positional arguments with the declared attributes, so never sees `video_processor` (None),
    and the processor has no such attribute, which `ProcessorMixin.__call__` checks before videos."""
    attributes = [name for name in processor_attributes(cls) if name != "video_processor"]
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": f"{cls.__name__} for images only (no video processor: its class needs torchvision).",
        "get_attributes": classmethod(lambda _cls: list(attributes)),
    }
    if cls.__name__ == "SmolVLMProcessor":
        # Its apply_chat_template only adds the video processor's frame settings, then renders.
        namespace["apply_chat_template"] = ProcessorMixin.apply_chat_template
    return type(cls.__name__, (cls,), namespace)


PIXTRAL = "transformers.models.pixtral"


def pixtral_processor_class() -> type[ProcessorMixin]:
    """`PixtralProcessor`; without torchvision, its module loaded under a private name.

    Its module does `from .image_processing_pixtral import get_resize_output_image_size`, and that
    module imports torchvision. `image_processing_pil_pixtral` defines the same function; while the
    private copy runs its imports, that name resolves to the PIL module, and the entry is removed
    again: `transformers.models.pixtral.*` stays as it was for everyone else.
    """
    if torchvision_usable():
        from transformers import PixtralProcessor

        return PixtralProcessor
    pil_module = importlib.import_module(f"{PIXTRAL}.image_processing_pil_pixtral")
    source = importlib.util.find_spec(f"{PIXTRAL}.processing_pixtral")
    private_name = f"{PIXTRAL}._processing_pixtral_pil"
    spec = importlib.util.spec_from_file_location(private_name, source.origin)
    module = importlib.util.module_from_spec(spec)
    stand_in = f"{PIXTRAL}.image_processing_pixtral"
    previous = sys.modules.get(stand_in)
    sys.modules[stand_in] = pil_module
    sys.modules[private_name] = module  # inspect (transformers' auto_docstring) looks the class's module up
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(private_name, None)
        raise
    finally:
        if previous is None:
            sys.modules.pop(stand_in, None)
        else:
            sys.modules[stand_in] = previous
    return _checked_pixtral(module)


def _checked_pixtral(module: ModuleType) -> type[ProcessorMixin]:
    if getattr(module, "get_resize_output_image_size", None) is None:
        raise ProcessorLoadError(f"PixtralProcessor could not be loaded without torchvision; {INSTALL_TORCHVISION}.")
    return module.PixtralProcessor
