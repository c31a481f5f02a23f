"""Finding and reading the weights of original LLaVA releases: the `mm_projector` tensors and the CLIP tower.

In: a spec, the model folder, the user's `projector_path` / `vision_tower` params. Out: a projector
state dict (`model.mm_projector.` prefix stripped, CPU tensors) and a (CLIP vision model, image
processor) pair. Tensors are read with safetensors or `torch.load(weights_only=True)`; nothing is
executed from a checkpoint. The hub is asked only when no local source was given or found.
This module does not build the projector or run anything.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from .specs import LlavaSpec

PROJECTOR_PREFIX = "model.mm_projector."
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class MissingWeightsError(FileNotFoundError):
    """Weights a pipeline needs were found in none of the places it looked (the message lists them)."""


def projector_from_file(path: Path) -> dict[str, torch.Tensor]:
    """The projector tensors of one .safetensors or .bin file, prefix stripped, on the CPU (`{}` if none)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {k[len(PROJECTOR_PREFIX):]: f.get_tensor(k) for k in f.keys() if k.startswith(PROJECTOR_PREFIX)}
    # mmap: a 10 GB LM shard is not read into memory just to take the projector out of it.
    data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {k[len(PROJECTOR_PREFIX):]: v for k, v in data.items() if k.startswith(PROJECTOR_PREFIX)}


def weight_files(folder: Path) -> list[Path]:
    """The files of `folder` that may hold projector tensors: the indexed shards, else every shard."""
    for index_name in INDEX_FILES:
        index = folder / index_name
        if index.exists():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return [folder / name for name in sorted({name for key, name in weight_map.items()
                                                      if key.startswith(PROJECTOR_PREFIX)})]
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    return files + [p for p in [folder / "mm_projector.bin"] if p.exists()]


def projector_from_folder(folder: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        found.update(projector_from_file(path))
    return found


def projector_from_hub(spec: LlavaSpec) -> dict[str, torch.Tensor]:
    from huggingface_hub import hf_hub_download

    return projector_from_file(Path(hf_hub_download(spec.projector_repo, spec.projector_filename)))


def load_projector_state(spec: LlavaSpec, model_folder: Optional[Path],
                         projector_path: Optional[str]) -> tuple[dict[str, torch.Tensor], str]:
    """(The projector's state dict, where it came from): `projector_path` if set, else the model folder, else the hub.

    Raises MissingWeightsError naming every place it looked.
    """
    if projector_path:
        path = Path(projector_path).expanduser()
        if not path.is_file():
            raise MissingWeightsError(f"multimodal-projector_path={projector_path!r} is not a file "
                                      f"(expected mm_projector.bin or a .safetensors file)")
        state = projector_from_file(path)
        if not state:
            raise MissingWeightsError(f"{path} holds no '{PROJECTOR_PREFIX}*' tensors: is it an mm_projector file?")
        return state, str(path)
    looked = []
    if model_folder is not None:
        state = projector_from_folder(model_folder)
        if state:
            return state, str(model_folder)
        looked.append(f"'{PROJECTOR_PREFIX}*' tensors in the model folder {model_folder}")
    hub = f"{spec.projector_repo}/{spec.projector_filename} on the Hugging Face hub"
    try:
        state = projector_from_hub(spec)
    except (OSError, ValueError) as error:  # offline, not cached, repo or file missing
        looked.append(f"{hub} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
        raise MissingWeightsError(
            f"No mm_projector weights for the '{spec.name}' pipeline. Looked for: {'; '.join(looked)}. "
            f"Set multimodal-projector_path to a local mm_projector.bin / .safetensors file, "
            f"or use a model folder that holds the projector.") from error
    if not state:
        raise MissingWeightsError(f"{hub} holds no '{PROJECTOR_PREFIX}*' tensors")
    return state, f"{spec.projector_repo}/{spec.projector_filename}"


def vision_source(spec: LlavaSpec, model_config: dict, vision_tower: Optional[str]) -> str:
    """Where the CLIP tower comes from: the `vision_tower` param, else the checkpoint's own
    `mm_vision_tower` when that is a local folder, else the spec's hub repo."""
    if vision_tower:
        if not Path(vision_tower).expanduser().is_dir():
            raise MissingWeightsError(f"multimodal-vision_tower={vision_tower!r} is not a folder "
                                      f"(expected a CLIP model folder like {spec.vision_repo})")
        return str(Path(vision_tower).expanduser())
    own = model_config.get("mm_vision_tower")
    if isinstance(own, str) and Path(own).expanduser().is_dir():
        return str(Path(own).expanduser())
    return spec.vision_repo


def load_vision_tower(spec: LlavaSpec, source: str, dtype: torch.dtype, device: torch.device):
    """(CLIPVisionModel in `dtype` on `device`, its PIL image processor). No torchvision needed."""
    from transformers import CLIPVisionModel

    try:
        processor = pil_clip_processor_class().from_pretrained(source)
        tower = CLIPVisionModel.from_pretrained(source, **dtype_argument(dtype))
    except OSError as error:
        raise MissingWeightsError(
            f"No CLIP vision tower for the '{spec.name}' pipeline at '{source}' (not a local folder, and not in the "
            f"Hugging Face cache or reachable). Set multimodal-vision_tower to a local copy of {spec.vision_repo}."
        ) from error
    return tower.to(device).eval(), processor


def pil_clip_processor_class() -> type:
    """CLIP's Pillow image processor: `CLIPImageProcessorPil` in transformers 5 (where the plain name
    needs torchvision); transformers 4 (old text-generation-webui) has only `CLIPImageProcessor`, PIL-based."""
    import transformers

    return getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor


def dtype_argument(dtype: torch.dtype) -> dict:
    """`from_pretrained`'s dtype keyword: `dtype` since transformers 4.56, `torch_dtype` before (old text-generation-webui)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}
