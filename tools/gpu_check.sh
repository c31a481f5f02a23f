#!/usr/bin/env bash
# Issue 49's GPU checks in one run: at most 8 minutes on a lent H100 or H200, one JSON object at the end.
#
# The call on the device machine (the device tool's `run`), after `bash tools/gpu_check.sh --prepare` here:
#   command:   bash tools/gpu_check.sh --device cuda
#   carry:     [".gpu"]
#   timeout_s: 590   (the sections' budgets add up to 480 s; each may run 5 s over before it is killed)
# Only some sections, e.g. to run again what failed on a warm machine:
#   command:   SECTIONS="multiturn decode" bash tools/gpu_check.sh --device cuda
# With little device time left: a shorter run, decode on 8 text layers (TOTAL_BUDGET caps the sections):
#   command:   TOTAL_BUDGET=200 SECTIONS="families vision decode" DECODE_LAYERS=8 DECODE_RUNS=2 bash tools/gpu_check.sh --device cuda
#   a section's own budget: BUDGET_<section>=SECONDS, e.g. BUDGET_decode=400 SECTIONS=decode (the compiled pair
#   at 32 layers did not fit 115 s on an H100 or an H200: decode now has 225 s, multiturn, which took 87 s of
#   its 220 on the H200, 110)
#
#   bash tools/gpu_check.sh --prepare       # here, with a network: wheels and harness files into .gpu/ (git-ignored)
#   bash tools/gpu_check.sh --device cpu    # the dry run: every section at tiny size on this CPU (.ci/run runs it)
#
# Sections, each under its own time budget (seconds on CUDA; the whole run stops at TOTAL_BUDGET, 480):
#   families  (35)  every image-text family (and the original LLaVA layout) through the host on cuda:0 in fp32,
#                   token for token against Hugging Face's generate (tools/families_on_device.py)
#   vision    (40)  the card's vision_device / vision_bits: tower fp16 on cuda:0 with the LM fp32 on the CPU,
#                   tower fp16 with the LM bf16 on cuda:0, tower fp32 on cuda:0 with the LM fp32 on the CPU
#                   (Mllama takes a device but not another dtype: refused with the cause), every family and
#                   the original LLaVA pipeline
#   tgw       (50)  the extension inside text-generation-webui 1dcde41d at its pins (transformers 5.6.2, stock
#                   gradio 4.37.2), started without --cpu: the harness's original LLaVA (attach, api) and the
#                   gemma3, llava, mllama and qwen2_5_vl checkpoints (attach, the Model tab's path)
#   multiturn (110) bench/multiturn.py --size real --dtype bf16 --text-layers 32: the table's summary; passes when
#                   the tokens are identical or every difference starts at an exact tie of HF's top two.
#                   --profile: one more run of ours, each turn's TTFT under torch's profiler (ttft_profiles:
#                   kernels, the host's operators and syncs; an H100 run had turn 3 at 757 ms, not explained; an
#                   H200 run had 47 ms of turn 5 in aten::_cudnn_attention_forward on the host, before the host
#                   turned cuDNN's attention off). MULTITURN_EXTRA=--cudnn-attention runs it with that backend on;
#                   MULTITURN_EXTRA=--static-cache measures the host's static cache (its default on CUDA), compiled
#                   before the first turn; without it the host's columns keep the dynamic cache
#   decode    (225) bench/decode.py --size real --dtype bf16 --text-layers 32 --compiled --runs 2 --json: our decode rate,
#                   HF eager, the compiled path, the fraction of the bandwidth limit (on multiturn's model folder),
#                   where our static path's tokens leave our dynamic path's (both top-two margins), and what
#                   torch.compile said: CUDA graphs skipped (and why), recompiles. Each run is logged as it ends
#                   (the eager pair first): a section stopped while compiling still reports those rates.
#                   DECODE_EQUAL_SLOTS=1 adds HF's compiled path with as many cache slots as ours (one more
#                   compile): what of the static gap is the cache's length, what the host's work per step.
#                   DECODE_PROFILE=1: then one more run of each column with 32 steps under torch's profiler
#                   (bench/step_profile.py): per step the wall time, the GPU's kernel time (so the share it
#                   waited for the host), the kernels that took it, and the CUDA calls that launch or sync.
#                   DECODE_BACKENDS=1: first, the history written with cuDNN's attention at new lengths, again
#                   at lengths it has planned, and without it (attention_backends; modules/attention_backend.py).
#                   DECODE_COMPILED=0 leaves out the compiled pair (no compile: a short call)
#   static    (90)  not in the 8 minutes: a second call, SECTIONS=static. Each family the static cache serves
#                   (modules/static_decode.py), in fp32 on cuda:0: a chat of three turns and one asked again,
#                   prefix cache on, our static path (compiled by transformers) against our dynamic path, reply
#                   for reply (tools/families_on_device.py --static-cache): what DEFAULT_ON_CUDA waits for
# On the CPU the same sections, static too, run at tiny size (LM and tower on the CPU: fp32, and bf16 against fp32).
#
# What travels: the working tree and `.gpu/` (the device machine has no network and no ../shared):
#   .gpu/whl-project  transformers 5.23.0 (this project's pin; the machine has 5.17) and num2words (SmolVLM)
#   .gpu/whl-tgw      text-generation-webui head's pins the machine lacks: transformers 5.6.2, tokenizers 0.22.2
#                     (5.6.2 refuses the machine's 0.23.2), gradio 4.37.2, gradio_client 1.0.2, fastapi 0.112.4,
#                     starlette, pydantic 2.11.0 and its core, ddgs (imported at start-up) and the rest of what a
#                     harness run imports there (measured in the harness's venv; TGW_WHEELS below)
#   .gpu/tgw          run_in_tgw.py, make_tiny_models.py and tgw-1dcde41d.tar.gz from the harness
# Installed with pip --target into $W/site-project and $W/site-tgw, put first on PYTHONPATH per section.
# Logs and section figures: $W (default /tmp/gpu_check); with $OUT set, gpu_check.json and the logs go there.
# Exit 0 only when every section passed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEVICE=cuda
PREPARE=
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --prepare) PREPARE=1; shift ;;
    *) echo "usage: gpu_check.sh [--prepare] [--device cuda|cpu]"; exit 2 ;;
  esac
done
GPU_DIR=$ROOT/.gpu
PROJECT_WHEELS="transformers==5.23.0 num2words==0.5.14"
TGW_WHEELS="transformers==5.6.2 tokenizers==0.22.2 gradio==4.37.2 gradio_client==1.0.2 fastapi==0.112.4
  starlette==0.38.6 pydantic==2.11.0 pydantic_core==2.33.0 typing-inspection==0.4.5 annotated-types==0.8.0
  orjson==3.11.5 pydub==0.25.1 ffmpy==1.0.0 python-multipart==0.0.20 semantic-version==2.10.0 tomlkit==0.12.0
  websockets==11.0.3 ddgs==9.14.1 cffi==2.0.0"
HARNESS_FILES="run_in_tgw.py make_tiny_models.py tgw-1dcde41d.tar.gz"

prepare() {  # wheels for Python 3.12 on x86-64 (the device machine's), and the harness files, into .gpu/
  local harness=${TGW_HARNESS:-$ROOT/../shared/tgw} platforms=() n
  for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/whl-project" "$GPU_DIR/whl-tgw" "$GPU_DIR/tgw" || return 1
  local py=$ROOT/.venv/bin/python; [ -x "$py" ] || py=python3
  local get=("$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
             "${platforms[@]}" --platform manylinux2014_x86_64 --platform any)
  # shellcheck disable=SC2086
  "${get[@]}" -d "$GPU_DIR/whl-project" $PROJECT_WHEELS && "${get[@]}" -d "$GPU_DIR/whl-tgw" $TGW_WHEELS || return 1
  for n in $HARNESS_FILES; do cp "$harness/$n" "$GPU_DIR/tgw/" || return 1; done
  local tree carried
  tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  carried=$(du -sb "$GPU_DIR" | cut -f1)
  echo "prepared $GPU_DIR: $((carried / 1048576)) MiB carried + $((tree / 1048576)) MiB working tree (limit 64 MiB)"
  [ $((tree + carried)) -lt $((64 * 1048576)) ] || { echo "over the 64 MiB a run may carry"; return 1; }
}

if [ -n "$PREPARE" ]; then prepare; exit; fi
[ "$DEVICE" = cuda ] || [ "$DEVICE" = cpu ] || { echo "--device cuda or cpu"; exit 2; }

W=${GPU_CHECK_WORK:-/tmp/gpu_check}
rm -rf "$W" && mkdir -p "$W"
# The real-size model folder (LLaVA-1.5-7B's shapes, saved in float16) lives outside $W: a second run on the same
# machine reuses it.
export REAL_MODEL=${REAL_MODEL:-/tmp/gpu_check_real_model}
export W DEVICE ROOT HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1
STARTED=$(date +%s)
if [ "$DEVICE" = cuda ]; then
  TOTAL_BUDGET=${TOTAL_BUDGET:-480}
  declare -A BUDGET=([setup]=20 [families]=35 [vision]=40 [tgw]=50 [multiturn]=110 [decode]=225 [static]=90)
  DEFAULT_SECTIONS="families vision tgw multiturn decode"
  export PY=python3 TGW_PY=python3 SITE_PROJECT=$W/site-project SITE_TGW=$W/site-tgw HARNESS=$GPU_DIR/tgw
  export LM_DEVICE=cuda:0
else  # the dry run: this repository's venv, and the harness's venv for text-generation-webui's head
  TOTAL_BUDGET=${TOTAL_BUDGET:-1500}
  declare -A BUDGET=([setup]=20 [families]=240 [vision]=300 [tgw]=420 [multiturn]=300 [decode]=300 [static]=120)
  DEFAULT_SECTIONS="families vision tgw multiturn decode static"
  PY=${PYTHON:-$ROOT/.venv/bin/python}; [ -x "$PY" ] || PY=python3
  export PY TGW_PY=${TGW_PYTHON:-/tmp/tgw_venv_head/bin/python} SITE_PROJECT= SITE_TGW=
  export HARNESS=${TGW_HARNESS:-$ROOT/../shared/tgw} LM_DEVICE=cpu
fi

project_py() { PYTHONPATH="$SITE_PROJECT${SITE_PROJECT:+:}$ROOT" "$PY" "$@"; }
tgw_py() { PYTHONPATH="$SITE_TGW" "$TGW_PY" "$@"; }

sec_setup() {  # the carried wheels, installed beside the machine's packages (which they shadow)
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || return 1
  [ "$DEVICE" = cuda ] || return 0
  [ -d "$GPU_DIR/whl-project" ] && [ -d "$GPU_DIR/whl-tgw" ] && [ -d "$HARNESS" ] || {
    echo "no .gpu/ here: run 'bash tools/gpu_check.sh --prepare' where there is a network, and carry .gpu"; return 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  local pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)
  "${pip[@]}" --target "$SITE_PROJECT" "$GPU_DIR"/whl-project/*.whl && \
    "${pip[@]}" --target "$SITE_TGW" "$GPU_DIR"/whl-tgw/*.whl || return 1
  project_py -c "import transformers; print('project: transformers', transformers.__version__)" &&
    tgw_py -c "import transformers, fastapi; print('tgw: transformers', transformers.__version__, 'fastapi', fastapi.__version__)"
}

sec_families() {
  project_py tools/families_on_device.py --lm "$LM_DEVICE/fp32" --json-out "$W/families.json"
}

sec_static() {
  project_py tools/families_on_device.py --lm "$LM_DEVICE/fp32" --static-cache --json-out "$W/static.json"
}

sec_vision() {  # each placement in its own process, side by side; the section fails if one does
  local runs rc=0 i=0 lm vision pids=()
  if [ "$DEVICE" = cuda ]; then runs=("cpu/fp32 cuda:0/fp16" "cuda:0/bf16 cuda:0/fp16" "cpu/fp32 cuda:0/fp32")
  else runs=("cpu/fp32 cpu/bf16" "cpu/bf16 cpu/fp32"); fi
  for pair in "${runs[@]}"; do
    read -r lm vision <<<"$pair"; i=$((i + 1))
    project_py tools/families_on_device.py --lm "$lm" --vision "$vision" --json-out "$W/vision-$i.json" \
      >"$W/vision-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    echo "== LM, tower: ${runs[$i]}"; grep -E "^(PASS|FAIL) " "$W/vision-$((i + 1)).log"
  done
  return $rc
}

tgw_run() {  # tgw_run NAME ARGS...: one harness run, text-generation-webui head on $DEVICE; its own unpacked tree
  tgw_py "$HARNESS/run_in_tgw.py" --tgw-tarball "$HARNESS/tgw-1dcde41d.tar.gz" --unpack-dir "$W/tgw-trees/$1" \
    --extension-dir "$ROOT/extensions/multimodal" --no-args-shim --device "$DEVICE" --threads 2 --turns 2 \
    --tag "$1" --run-dir "$W/tgw-runs/$1" --json-out "$W/tgw-runs/$1.json" "${@:2}" >"$W/tgw-$1.log" 2>&1
  local rc=$?
  echo "$1 $rc" >>"$W/tgw-verdicts"
  echo "$([ $rc = 0 ] && echo PASS || echo FAIL) $1 (exit $rc): $(grep -E 'RESULT|Error' "$W/tgw-$1.log" | tail -1 | cut -c1-200)"
}

sec_tgw() {
  local families="gemma3 llava mllama qwen2_5_vl" fam
  mkdir -p "$W/tgw-runs" && : >"$W/tgw-verdicts"
  tgw_py "$HARNESS/make_tiny_models.py" --out "$W/tgw-models" >"$W/tgw-models.log" 2>&1 &
  local models=$!
  # shellcheck disable=SC2086
  project_py tools/tgw_families.py build "$W/tgw-families" $families >"$W/tgw-families.log" 2>&1 || {
    echo "family checkpoints: see $W/tgw-families.log"; return 1; }
  wait $models || { echo "tiny models: see $W/tgw-models.log"; return 1; }
  tgw_run llava-v1.5-attach --models-info "$W/tgw-models/tiny_models.json" --image-mode attach &
  tgw_run llava-v1.5-api --models-info "$W/tgw-models/tiny_models.json" --image-mode api &
  for fam in $families; do
    tgw_run "$fam-attach" --models-info "$W/tgw-families/$fam.json" --any-route --model-after-extensions \
      --image-mode attach &
  done
  wait
  ! grep -qv " 0$" "$W/tgw-verdicts"
}

whole_model_or_none() {  # a folder cut short (a section out of time while saving) is built again, not loaded
  [ -f "$REAL_MODEL/tokenizer_config.json" ] || rm -rf "$REAL_MODEL"  # the processor is saved last
}

sec_multiturn() {
  if [ "$DEVICE" = cuda ]; then
    whole_model_or_none
    project_py bench/multiturn.py --size real --dtype bf16 --device cuda --text-layers 32 \
      --model-dir "$REAL_MODEL" --json-out "$W/multiturn-table.json" --profile ${MULTITURN_EXTRA:-}
  else
    project_py bench/multiturn.py --size small --dtype fp32 --device cpu --text-layers 1 --vision-layers 1 \
      --repeats 1 --max-new-tokens 4 --json-out "$W/multiturn-table.json" --profile
  fi
}

sec_decode() {  # bench/decode.py's own JSON (its last line)
  [ -f bench/decode.py ] || { echo "bench/decode.py is not in this tree yet"; return 1; }
  if [ "$DEVICE" = cuda ]; then
    whole_model_or_none
    # DECODE_LAYERS: fewer text layers (LLaVA-1.5-7B's widths) when the device time left is short; the folder
    # multiturn built is used only at its 32.
    local layers=${DECODE_LAYERS:-32} folder=$REAL_MODEL
    [ "$layers" = 32 ] || folder=$REAL_MODEL-$layers
    # cudagraphs, perf_hints: torch.compile says where it skips CUDA graphs, and why (the report lists them).
    TORCH_LOGS=cudagraphs,perf_hints,recompiles \
      project_py bench/decode.py --device cuda --dtype bf16 --size real --text-layers "$layers" --runs "${DECODE_RUNS:-2}" \
      --new-tokens 128 $([ "${DECODE_COMPILED:-1}" = 0 ] || echo --compiled) ${DECODE_EQUAL_SLOTS:+--equal-slots} \
      ${DECODE_PROFILE:+--profile} ${DECODE_BACKENDS:+--attention-backends} --json \
      --model-dir "$folder"  # built when missing
  else
    project_py bench/decode.py --device cpu --dtype fp32 --size small --text-layers 1 --runs 1 --new-tokens 8 \
      --compiled --equal-slots --profile --attention-backends --json
  fi
}

export -f whole_model_or_none project_py tgw_py sec_setup sec_families sec_static sec_vision sec_tgw tgw_run sec_multiturn sec_decode
export GPU_DIR

failed=0
for name in setup ${SECTIONS:-$DEFAULT_SECTIONS}; do
  left=$((TOTAL_BUDGET - ($(date +%s) - STARTED)))
  own="BUDGET_$name"; budget=${!own:-${BUDGET[$name]:-60}}; [ "$budget" -le "$left" ] || budget=$left
  start=$(date +%s)
  if [ "$budget" -lt 5 ]; then
    echo "skipped: $budget s to run it ($left s left of the run's $TOTAL_BUDGET)" >"$W/$name.log"; rc=124
  else
    timeout -k 5 "$budget" bash -c "sec_$name" >"$W/$name.log" 2>&1; rc=$?
  fi
  echo "$name $rc $(($(date +%s) - start)) $budget" >>"$W/verdicts"
  [ $rc = 0 ] || failed=$((failed + 1))
  echo "$([ $rc = 0 ] && echo PASS || echo FAIL) $name ($(($(date +%s) - start)) s of $budget): $(tail -1 "$W/$name.log" | cut -c1-160)"
  [ "$name" = setup ] && [ $rc != 0 ] && break  # nothing else can run without the wheels
done

"$PY" "$ROOT/tools/gpu_check_report.py" "$W" "$DEVICE" >"$W/gpu_check.json" || failed=$((failed + 1))
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$W/gpu_check.json" "$OUT/" && tar czf "$OUT/gpu_check_logs.tar.gz" -C "$W" \
    --exclude=site-project --exclude=site-tgw --exclude=tgw-trees --exclude=tgw-models --exclude=tgw-families \
    --exclude='tgw-runs/*/tgw' --exclude='tgw-runs/*/gradio_uploads' .
fi
cat "$W/gpu_check.json"
[ $failed = 0 ]
