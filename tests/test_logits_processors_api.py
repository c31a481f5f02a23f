"""Per-request logits-processor arguments through the OpenAI-compatible API (a live server, tiny Llama)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import openai
import pytest

from examples.target_token import TargetTokenLogitsProcessor
from modules.text_generation import decode, encode
from fixtures import api_helpers
from tests.exploding_processor import Exploding
from tests.conftest import ROOT

N = 5
BODY = {"prompt": "The quick brown fox", "max_tokens": N, "temperature": 0, "ban_eos_token": True}


@pytest.fixture(scope="module")
def api(llama_dir):
    argv = ["--logits-processors", "examples.target_token:TargetTokenLogitsProcessor"]
    with api_helpers.serving(llama_dir, argv=argv, logits_processors=[Exploding]) as live:
        yield live


@pytest.fixture(scope="module")
def red(api) -> int:
    (token,) = encode(" red", add_special_tokens=False)[0].tolist()
    return token


def completion(api, **extra) -> str:
    response = api.post("/completions", json={**BODY, **extra})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_completions_take_logits_processor_args_and_vllm_xargs(api, red):
    plain = completion(api)
    assert completion(api, logits_processor_args={"target_token": red}) == " red" * N
    assert completion(api, vllm_xargs={"target_token": red}) == " red" * N
    assert completion(api) == plain != " red" * N


def test_chat_through_the_openai_client_extra_body(api, red):
    client = api.client()
    messages = [{"role": "user", "content": "Hello"}]
    kwargs = dict(model="any", messages=messages, max_tokens=N, temperature=0)
    forced = client.chat.completions.create(**kwargs, extra_body={"logits_processor_args": {"target_token": red},
                                                                  "ban_eos_token": True})
    assert forced.choices[0].message.content == "red" + " red" * (N - 1)
    plain = client.chat.completions.create(**kwargs)
    assert "red red" not in plain.choices[0].message.content
    streamed = client.chat.completions.create(**kwargs, stream=True, extra_body={"vllm_xargs": {"target_token": red},
                                                                                "ban_eos_token": True})
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == \
        forced.choices[0].message.content


@pytest.mark.parametrize("extra, status, text", [
    ({"logits_processor_args": {"target_token": 1}, "vllm_xargs": {"target_token": 1}}, 422, "not both"),
    ({"logits_processor_args": "target_token=5"}, 422, "logits_processor_args"),
    ({"vllm_xargs": [1, 2]}, 422, "vllm_xargs"),
    ({"logits_processor_args": {"target_token": "red"}}, 400, "target_token must be a token id"),
])
def test_bad_arguments_are_refused_with_the_reason(api, extra, status, text):
    response = api.post("/completions", json={**BODY, **extra})
    assert response.status_code == status, response.text
    assert text in response.json()["error"]["message"]


def test_a_processor_that_raises_fails_that_request_with_500_and_the_server_keeps_serving(api, red):
    response = api.post("/completions", json={**BODY, "logits_processor_args": {"explode": True}})
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "generation_failed"
    assert "Exploding failed in apply(): RuntimeError: the fuse was lit" in error["message"]
    with pytest.raises(openai.InternalServerError, match="the fuse was lit"):
        api.client().chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                             stream=True, extra_body={"vllm_xargs": {"explode": 1}})
    assert api_helpers.wait_until_unlocked()
    assert completion(api, logits_processor_args={"target_token": red}) == " red" * N


def test_the_example_processor_is_the_one_loaded_by_class_path(api):
    from modules import shared

    assert any(type(p) is TargetTokenLogitsProcessor for p in shared.logits_processors.processors)


def test_readme_curl_example_forces_its_token(api):
    """The curl command of README.md's "Logits processors" section, against the live server."""
    section = (ROOT / "README.md").read_text().split("## Logits processors", 1)[1].split("\n## ", 1)[0]
    (curl,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    port = api.url.split(":")[-1].split("/")[0]
    done = subprocess.run(["bash", "-c", curl.replace("5000", port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = json.loads(done.stdout)["choices"][0]["text"]
    token = json.loads(re.search(r"-d '(.*)'", curl).group(1))["logits_processor_args"]["target_token"]
    assert text == decode([token] * 8) and text
