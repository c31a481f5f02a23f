"""A vLLM engine that is slow, killed mid-reply, down, and back: the host says so clearly and keeps serving.

A real vLLM server of its own (it is paused, killed and restarted here), started with an API key the
host must send (`--engine-api-key`). Paused (SIGSTOP on its process group), it accepts connections but
answers nothing: the host gives up after its `--engine-timeout` with a 503. Killed mid-stream, the
stream ends with an error event; while it is down, requests get a 503 naming it; restarted on the same
port, the next request is answered. No key appears in the host's log.
Where vLLM is not installed the module is skipped, except in CI (CI=true), where that fails.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from fixtures.api_helpers import data_url, image_bytes
from tools.vllm_cpu.process import ROOT, free_port, host_server, start_vllm, vllm_installed

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "engine-faults"
KEY = "engine-key-5f1c0e"
TIMEOUT_SECONDS = 4
LONG_REPLY = 1500  # tokens; about 5 s of vLLM on 2 cores

if not vllm_installed():
    if os.environ.get("CI"):
        pytest.fail("CI must run the engine tests: .ci/run installs vLLM with tools/vllm_cpu/install.sh",
                    pytrace=False)
    pytest.skip("vLLM is not installed (bash tools/vllm_cpu/install.sh)", allow_module_level=True)

MESSAGES = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image_bytes())}},
                                         {"type": "text", "text": "What shape is this?"}]}]


def start_engine(port: int):
    return start_vllm(ARTIFACTS / "vllm.log", port, extra=("--api-key", KEY))


@pytest.fixture(scope="module")
def engine():
    """A holder for the current vLLM process (tests restart it on the same port)."""
    port = free_port()
    holder = {"port": port, "server": start_engine(port)}
    yield holder
    holder["server"].stop()


@pytest.fixture(scope="module")
def host(engine):
    args = ["--engine-url", f"http://127.0.0.1:{engine['port']}/v1", "--engine-api-key", KEY,
            "--engine-timeout", str(TIMEOUT_SECONDS)]
    with host_server(args, ARTIFACTS / "host.log") as running:
        yield running


def ask(host, **fields) -> httpx.Response:
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 16, **fields}
    return httpx.post(f"{host.url}/chat/completions", json=body, timeout=120)


def test_the_key_reaches_vllm(host):
    response = ask(host)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "It is a circle."


def test_a_paused_engine_times_out_with_a_clear_503_and_then_serves_again(host, engine):
    engine["server"].signal(signal.SIGSTOP)
    try:
        response = ask(host)
    finally:
        engine["server"].signal(signal.SIGCONT)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "engine_unavailable"
    assert f"did not answer within {TIMEOUT_SECONDS} s" in error["message"]
    assert ask(host).status_code == 200


def killed_mid_reply(host, engine) -> list[dict]:
    """Stream a long reply and SIGKILL the engine a second in, or at the first piece if that comes sooner;
    return the stream's events. The engine is left dead."""
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": LONG_REPLY, "ban_eos_token": True,
            "stream": True, "stream_options": {"include_usage": True}}
    events = []
    # On these 2 cores vLLM may stream a reply in one late burst, so the kill cannot wait for the stream's
    # first pieces alone; on a faster or less busy machine the whole reply can come within a second.
    killer = threading.Timer(1.0, engine["server"].signal, (signal.SIGKILL,))
    killer.start()
    with httpx.stream("POST", f"{host.url}/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if len(events) == 2 and killer.is_alive():  # the first content piece
                    killer.cancel()
                    engine["server"].signal(signal.SIGKILL)
    killer.join()
    engine["server"].stop()
    return events


def whole(events: list[dict]) -> bool:
    """Did the reply come whole, all its tokens and a "length" finish, before the kill reached the engine?"""
    finishes = [choice.get("finish_reason") for event in events for choice in event.get("choices", [])]
    usage = events[-1].get("usage") if events else None
    return "length" in finishes and bool(usage) and usage["completion_tokens"] == LONG_REPLY


def restart(engine) -> None:
    engine["server"].stop()
    engine["server"] = start_engine(engine["port"])


def test_an_engine_killed_mid_reply_then_down_then_back(host, engine):
    try:
        for _ in range(3):  # a reply that came whole before the kill tests nothing: kill again
            events = killed_mid_reply(host, engine)
            if not whole(events):
                break
            restart(engine)
        assert events and "error" in events[-1], events[-2:]
        message = events[-1]["error"]["message"]
        assert "broke off the reply" in message or "ended the reply" in message, message

        down = ask(host)
        assert down.status_code == 503 and "cannot be reached" in down.json()["error"]["message"]
    finally:  # whatever failed above, the tests after this one get a live engine
        restart(engine)
    again = ask(host)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"]["content"] == "It is a circle."


def test_no_key_in_the_host_log(host):
    assert KEY not in host.log.read_text()


def test_a_wrong_key_stops_the_start_with_a_clear_message(engine):
    wrong = "wrong-key-93ad1"
    result = subprocess.run([sys.executable, "server.py", "--engine-url", f"http://127.0.0.1:{engine['port']}/v1",
                             "--engine-api-key", wrong, "--nowebui", "--api", "--api-port", str(free_port())],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "refused the host's key" in output and "--engine-api-key" in output
    assert wrong not in output and "Traceback" not in output
