"""The host's side of a remote engine, without vLLM: an engine that is down, the BOS it is sent, the
samplers, the prompt's pictures, and the UI's logins.

"Down" is real: a port nothing listens on, reached through the host's own HTTP client. What vLLM
does with the requests is tests/test_engine_vllm.py's and tests/test_engine_faults.py's.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from modules import chat, extensions, models, remote_generation, shared
from modules.engine import EngineUnavailableError, safe_url
from modules.openai_engine import OpenAIChatEngine
from modules.text_generation import request_params
from server import LoginError, gradio_logins
from fixtures.api_helpers import image_bytes, start_api
from fixtures.browser_helpers import server_process
from tools.vllm_cpu.process import free_port

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "tiny-llava-shapes"


@pytest.fixture
def down_engine(host):
    """The demo's folder loaded without weights, generating through an engine that is down."""
    url = f"http://user:secret-pw@127.0.0.1:{free_port()}/v1"
    shared.args = shared.parse_args(["--engine-url", url])
    shared.model, shared.tokenizer = models.load_without_weights(str(DEMO))
    shared.model_name = DEMO.name
    shared.engine = OpenAIChatEngine(url, api_key="secret-key", timeout=5)
    shared.args.extensions.append("multimodal")
    extensions.load_extensions()
    yield shared.engine
    shared.engine.close()


def test_the_weightless_model_holds_no_weights(down_engine):
    parameters = list(shared.model.parameters())
    assert sum(p.untyped_storage().nbytes() for p in parameters if p.device.type != "meta") <= 8
    assert shared.settings["truncation_length"] == 2048  # from the folder's config


def test_an_engine_that_is_down_keeps_the_turn_and_its_picture_in_the_chat(down_engine):
    from modules import ui_chat

    ui_chat.create_interface()  # registers the extension's picture input and budget option
    picture = image_bytes("red", "circle", 40)
    outputs = list(ui_chat.generate("What shape is this?", chat.new_history(), 16, 0.0, 1.0, 2048, [picture], "default"))
    display, history = outputs[-1]
    assert len(history["internal"]) == 1
    user, reply = history["internal"][0]
    assert "What shape is this?" in user and re.search(r'<img src="data:image/png;base64,', user)
    assert reply == ""
    assert "cannot be reached" in history["visible"][0][1] and "cannot be reached" in display
    assert "secret" not in display


def test_an_engine_that_is_down_is_a_503_in_the_api(down_engine):
    api = start_api()
    try:
        response = api.post("/chat/completions", json={"messages": [{"role": "user", "content": "Hello"}]})
    finally:
        api.stop()
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "engine_unavailable" and "cannot be reached" in error["message"]
    assert "secret" not in response.text
    assert "127.0.0.1" in error["message"]


def test_logits_processor_arguments_are_refused_not_ignored(down_engine):
    state = chat.new_state(logits_processor_args={"target_token": 5})
    with pytest.raises(ValueError, match="need logits processors in the engine") as refused:
        remote_generation.engine_request("USER: Hi\nASSISTANT:", state, [], request_params(state))
    assert "--logits-processors modules.vllm_logits:" in str(refused.value)


def test_logits_processor_arguments_go_as_vllm_xargs_checked_by_the_engines_processors(down_engine):
    from examples.target_token import TargetTokenLogitsProcessor

    down_engine.logits_processors = (TargetTokenLogitsProcessor,)
    state = chat.new_state(logits_processor_args={"target_token": 5})
    request = remote_generation.engine_request("USER: Hi\nASSISTANT:", state, [], request_params(state))
    assert request.sampling["vllm_xargs"] == {"target_token": 5}
    state = chat.new_state(logits_processor_args={"target_token": "five"})
    with pytest.raises(ValueError, match="target_token must be a token id"):
        remote_generation.engine_request("USER: Hi\nASSISTANT:", state, [], request_params(state))


def test_the_request_carries_the_pictures_as_sent_and_the_local_prompt(down_engine):
    picture = image_bytes("blue", "square", 40, fmt="JPEG")
    state = chat.new_state(max_new_tokens=8, temperature=0)
    state[chat.MESSAGE_IMAGES] = [picture]
    text, _ = chat.user_message("What color is the shape?", state)
    chat.start_turn(state)
    prompt = chat.generate_chat_prompt(text, state)
    request = remote_generation.engine_request(prompt, state, [], request_params(state))
    assert request.images == [f"data:image/jpeg;base64,{__import__('base64').b64encode(picture).decode()}"]
    assert request.prompt_pieces == ["USER: ", "What color is the shape?\nASSISTANT:"]
    assert request.image_placeholder == "<image>\n"  # what the demo's template writes for a picture
    assert request.add_special_tokens  # the demo's tokenizer adds its BOS; its template writes none
    assert state[chat.IMAGE_TOKENS] == [65]
    assert request.sampling["temperature"] == 0.0 and request.sampling["max_tokens"] == 8


def test_a_picture_budget_becomes_the_engines_processor_kwargs(host, family_folder):
    """Qwen2-VL's budget knob, as the request's mm_processor_kwargs; each picture's cost at that budget is the
    local engine's (the same layouts), and a smaller budget costs fewer tokens."""
    folder = family_folder("qwen2_vl")
    shared.args = shared.parse_args(["--engine-url", "http://127.0.0.1:1/v1"])
    shared.model, shared.tokenizer = models.load_without_weights(str(folder))
    shared.engine = OpenAIChatEngine("http://127.0.0.1:1/v1", timeout=1)
    shared.args.extensions.append("multimodal")
    extensions.load_extensions()
    picture = image_bytes("red", "circle", 320)
    costs, kwargs = {}, {}
    for budget in ("default", "4096"):  # the tiny checkpoint reads up to 16384 pixels by default
        state = chat.new_state(max_new_tokens=8, temperature=0, image_budget=budget)
        state[chat.MESSAGE_IMAGES] = [picture]
        text, _ = chat.user_message("What is this?", state)
        request = remote_generation.engine_request(chat.generate_chat_prompt(text, state), state, [],
                                                   request_params(state))
        costs[budget], kwargs[budget] = state[chat.IMAGE_TOKENS], request.processor_kwargs
    assert kwargs["default"] == {}
    assert kwargs["4096"]["size"]["longest_edge"] == 4096
    assert costs["4096"][0] < costs["default"][0]
    shared.engine.close()


def test_the_bos_is_the_local_engines(down_engine):
    bos = shared.tokenizer.bos_token
    assert remote_generation.with_bos(f"{bos}USER: hi", {"add_bos_token": False}) == (f"{bos}USER: hi", False)
    assert remote_generation.with_bos("USER: hi", {"add_bos_token": False}) == ("USER: hi", True)
    assert remote_generation.with_bos("USER: hi", {"add_bos_token": True}) == ("USER: hi", True)


def test_a_bos_the_tokenizer_would_not_add_is_written_in(host, llama_dir):
    shared.args = shared.parse_args([])
    shared.tokenizer = models.load_tokenizer(llama_dir)
    adds = remote_generation.tokenizer_adds_bos(shared.tokenizer)
    text, special = remote_generation.with_bos("Hello", {"add_bos_token": True})
    assert (text, special) == (("Hello", True) if adds else (shared.tokenizer.bos_token + "Hello", False))


def test_samplers_reach_the_engine_under_its_names():
    state = {"max_new_tokens": 9, "seed": 5, "repetition_penalty": 1.1, "temperature": 0.8, "top_p": 0.5,
             "top_k": 0, "do_sample": True, "ban_eos_token": True}
    shared.tokenizer = type("T", (), {"eos_token_id": 2})()
    fields = remote_generation.sampling(state, ["\nUSER:"], greedy=False)
    assert fields == {"max_tokens": 9, "seed": 5, "repetition_penalty": 1.1, "skip_special_tokens": True,
                      "temperature": 0.8, "top_p": 0.5, "top_k": -1, "stop": ["\nUSER:"], "logit_bias": {"2": -100}}


def test_urls_lose_their_credentials_in_messages():
    assert safe_url("http://u:p@host:8000/v1") == "http://host:8000/v1"
    assert safe_url("https://host/v1") == "https://host/v1"
    engine = OpenAIChatEngine("http://u:pw@127.0.0.1:1/v1", timeout=1)
    with pytest.raises(EngineUnavailableError) as caught:
        engine.served_model(None)
    assert "pw" not in str(caught.value) and "127.0.0.1:1" in str(caught.value)


def test_an_engine_down_at_start_stops_the_start_with_a_clear_message():
    url = f"http://admin:hunter2@127.0.0.1:{free_port()}/v1"
    result = subprocess.run([sys.executable, "server.py", "--engine-url", url, "--engine-timeout", "1",
                             "--engine-api-key", "sk-never-shown", "--nowebui", "--api"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Cannot start" in output and "cannot be reached" in output and "Traceback" not in output
    assert "hunter2" not in output and "sk-never-shown" not in output


def test_logins_as_text_generation_webui_reads_them(tmp_path):
    path = tmp_path / "logins.txt"
    path.write_text("ann:pw1,bob:pw:with:colons\n\ncy:pw3\n")
    assert gradio_logins("dee:pw4", str(path)) == [("ann", "pw1"), ("bob", "pw:with:colons"), ("cy", "pw3"),
                                                   ("dee", "pw4")]
    with pytest.raises(LoginError) as caught:
        gradio_logins("no-colon-here", None)
    assert "no-colon-here" not in str(caught.value)


def test_the_ui_asks_for_a_login(tmp_path):
    with server_process(["--gradio-auth", "ann:open-sesame"], tmp_path / "server.log") as url:
        assert httpx.get(url + "config", timeout=10).status_code == 401
        wrong = httpx.post(url + "login", data={"username": "ann", "password": "nope"}, timeout=10)
        right = httpx.post(url + "login", data={"username": "ann", "password": "open-sesame"}, timeout=10)
        assert wrong.status_code == 400 and right.status_code == 200
        assert httpx.get(url + "config", cookies=right.cookies, timeout=10).status_code == 200
    assert "open-sesame" not in (tmp_path / "server.log").read_text()
