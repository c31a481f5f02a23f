"""Today's text-generation-webui as a user starts it, over HTTP: `--model` at start-up, then a model change.

    python tools/tgw_server_check.py HARNESS_WORK_DIR FAMILIES_DIR START_FAMILY NEXT_FAMILY

Run with text-generation-webui's Python (the harness's `/tmp/tgw_venv_head`). In an overlay of its
source with this extension (the harness's own `build_overlay`; nothing is edited), it starts
`extensions/multimodal/launch.py --model START_FAMILY --extensions multimodal --nowebui --api` on
CPU, as a real server process, then through its OpenAI API:
1. a chat with a picture, and the same chat with another picture: the replies differ;
2. likewise a second turn, the picture kept in the history (an image_url part in an earlier message);
3. `POST /v1/internal/model/load` NEXT_FAMILY (the Model tab's path through the API; the extension
   picks the new model's route), then 1 again.
Token identity with Hugging Face is checked by the harness runs (`tools/check_in_tgw.sh`); this checks
the start-up path and the model change in the real server. Exit 0 when all hold.
"""
from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 300) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it served {url}")
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"no answer from {url} in {seconds} s")


def data_url(picture) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat(api: str, messages: list) -> str:
    body = {"messages": messages, "max_tokens": 16, "do_sample": False, "temperature": 1, "top_k": 0,
            "top_p": 1, "min_p": 0, "ban_eos_token": True, "seed": 1, "mode": "instruct"}
    return post(f"{api}/v1/chat/completions", body)["choices"][0]["message"]["content"]


def check_pictures(api: str, family: str, pictures) -> int:
    """Two turns, each asked with either picture: the replies must differ (a tiny random model may
    well answer with special tokens only, an empty text, for one of them)."""
    failed = 0
    for turn in (1, 2):
        replies = [chat(api, conversation(picture, turn)) for picture in pictures]
        ok = replies[0] != replies[1]
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {family} turn {turn}{' (the picture in the history)' if turn == 2 else ''}: "
              f"{replies[0]!r} / with another picture {replies[1]!r}")
    return failed


def conversation(picture, turn: int) -> list:
    first = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                          {"type": "image_url", "image_url": {"url": data_url(picture)}}]}]
    if turn == 1:
        return first
    return first + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "What color is it?"}]


def start(tgw: Path, families: Path, family: str, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, HF_HOME=str(families / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               GRADIO_ANALYTICS_ENABLED="False")
    command = [sys.executable, "extensions/multimodal/launch.py", "--model", family, "--model-dir",
               str(families / "models"), "--loader", "Transformers", "--cpu", "--extensions", "multimodal",
               "--nowebui", "--api", "--api-port", str(port)]
    return subprocess.Popen(command, cwd=tgw, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def main() -> int:
    work, families, first, second = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.path.insert(0, str(work))
    from PIL import ImageOps
    from run_in_tgw import build_overlay, make_picture, unpack_tarball

    tree = unpack_tarball(work / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
    tgw = build_overlay(tree, ROOT / "extensions" / "multimodal", work / "runs" / "server-check", [])
    port, log = free_port(), work / "server-check.log"
    process = start(tgw, families, first, port, log)
    api = f"http://127.0.0.1:{port}"
    pictures = [make_picture(), ImageOps.invert(make_picture())]
    try:
        wait_for(f"{api}/v1/models", process)
        failed = check_pictures(api, f"{first} (--model at start-up, through launch.py)", pictures)
        post(f"{api}/v1/internal/model/load", {"model_name": second})
        failed += check_pictures(api, f"{second} (loaded through /v1/internal/model/load)", pictures)
    finally:
        process.terminate()
        process.wait(30)
    print(f"{4 - failed} passed, {failed} failed (server log: {log})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
