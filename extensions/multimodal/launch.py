"""text-generation-webui's own server.py, with `--model` able to load image-text checkpoints at start-up.

    cd text-generation-webui
    python user_data/extensions/multimodal/launch.py --model Qwen2.5-VL-3B-Instruct --extensions multimodal

text-generation-webui loads the `--model` of its command line before it imports any extension, with
`AutoModelForCausalLM`, which refuses most image-text configs (Qwen2-VL, llava-hf, SmolVLM, ...);
the error ends the server. This registers their full classes with it first (what the extension's
`setup()` does for models loaded later, from the Model tab or the API), then runs server.py from the
current folder, unchanged, with the same arguments. Nothing of text-generation-webui is edited.
Run it with text-generation-webui's Python (e.g. `installer_files/env/bin/python`).
"""
from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HF_AUTO = HERE / "pipelines" / "hf_auto"
PACKAGE = "_multimodal_launch_hf_auto"  # a private name: the extension later imports its own copy


def register() -> list[str]:
    """`hf_auto/auto_classes.py`, imported without the extension (no `modules.*` before server.py runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_multimodal_launch_packages", HERE / "core" / "folder_packages.py")
    folder_packages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(folder_packages)
    folder_packages.register_package(PACKAGE, [HF_AUTO])
    auto_classes = importlib.import_module(f"{PACKAGE}.auto_classes")
    return auto_classes.register_image_text_classes()


def main() -> None:
    server = Path.cwd() / "server.py"
    if not server.is_file() or not (Path.cwd() / "modules" / "shared.py").is_file():
        raise SystemExit(f"Run this from text-generation-webui's folder (no server.py in {Path.cwd()}).")
    registered = register()
    print(f"multimodal: AutoModelForCausalLM loads {', '.join(registered) or 'no more'} image-text models whole",
          flush=True)
    sys.argv[0] = str(server)
    sys.path[0] = str(server.parent)  # as `python server.py` has it (not this file's folder)
    runpy.run_path(str(server), run_name="__main__")


if __name__ == "__main__":
    main()
