"""The OpenAI-compatible API against a live server, driven by the official `openai` package.

Differential where possible: the API's greedy reply must equal the host's own `generate_reply` on the
prompt `generate_chat_prompt` builds, and a stream must add up to the non-streamed reply.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from modules import chat, shared
from modules.api.messages import Message, to_chat_input
from modules.text_generation import encode, generate_reply
from fixtures import api_helpers, host_helpers

ROOT = Path(__file__).resolve().parent.parent
GREEDY = dict(model="any", temperature=0, max_tokens=10)


@pytest.fixture(scope="module")
def llava_api(llava_dir):
    with api_helpers.serving(llava_dir, ["multimodal"]) as api:
        yield api


def expected_chat_reply(user: str, max_new_tokens: int = 10, history=None, system: str = "",
                        **settings) -> tuple[str, dict]:
    """The host's own chat path, without HTTP: the oracle for the API."""
    state = host_helpers.greedy_state(max_new_tokens=max_new_tokens, system_message=system, **settings)
    history = history or chat.new_history()
    prompt = chat.generate_chat_prompt(user, state, history=history)
    reply = list(generate_reply(prompt, state, stopping_strings=chat.get_stopping_strings(state), is_chat=True))[-1]
    return reply.lstrip(" "), dict(state["generation_stats"], prompt=prompt)


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# -- Text -----------------------------------------------------------------------------------------

def test_chat_reply_equals_the_host_chat_path(llama_api):
    result = llama_api.client().chat.completions.create(messages=[{"role": "user", "content": "Hello world"}], **GREEDY)
    expected, stats = expected_chat_reply("Hello world")
    assert result.choices[0].message.content == expected
    assert result.choices[0].message.role == "assistant"
    assert result.usage.prompt_tokens == len(encode(stats["prompt"])[0]) == stats["prompt_tokens"]
    assert result.usage.completion_tokens == stats["completion_tokens"]
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    assert result.choices[0].finish_reason == stats["finish_reason"]
    assert result.object == "chat.completion" and result.model == shared.model_name


def test_system_message_and_history_reach_the_prompt(llama_api):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is in the picture?"},
                {"role": "assistant", "content": "A red circle."},
                {"role": "user", "content": [{"type": "text", "text": "And the background?"}]}]
    result = llama_api.client().chat.completions.create(messages=messages, **GREEDY)
    history = {"internal": [["What is in the picture?", "A red circle."]], "visible": []}
    expected, stats = expected_chat_reply("And the background?", history=history, system="You are terse.")
    assert stats["prompt"].startswith("You are terse.\nUSER: What is in the picture?\nASSISTANT: A red circle.")
    assert result.choices[0].message.content == expected
    assert result.usage.prompt_tokens == stats["prompt_tokens"]


def test_messages_become_turns():
    chat_in = to_chat_input([(role, Message(text, [text.encode()] if role == "user" else [])) for role, text in [
        ("system", "S1"), ("user", "a"), ("user", "b"), ("assistant", "c"), ("developer", "S2"), ("assistant", "d"),
        ("user", "e")]])
    assert chat_in.system_message == "S1\n\nS2"
    assert chat_in.turns == [("a\nb", [b"a", b"b"], "c\nd")]
    assert (chat_in.user_input, chat_in.continue_last) == (Message("e", [b"e"]), False)
    prefill = to_chat_input([("user", Message("a")), ("assistant", Message("The answer is"))])
    assert prefill.turns == [("a", [], "The answer is")] and prefill.continue_last


def test_stream_adds_up_to_the_reply(llama_api, monkeypatch):
    monkeypatch.setitem(shared.settings, "max_updates_second", 0)  # a chunk a token: the tiny model is fast
    body = {"messages": [{"role": "user", "content": "Hello world"}], "stream": True,
            "stream_options": {"include_usage": True}, **GREEDY}
    with httpx.stream("POST", f"{llama_api.url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    expected, stats = expected_chat_reply("Hello world")
    assert text == expected
    assert chunks[-2]["choices"][0]["finish_reason"] == stats["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == stats["completion_tokens"]
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) > 1, "streams in pieces"


def test_a_fast_stream_sends_at_most_max_updates_second_chunks(llama_api):
    """At the default 50 updates a second, the tiny model's 64 tokens come a few to a chunk, the first at
    once; the text is the reply's."""
    assert shared.settings["max_updates_second"] == 50
    body = {"messages": [{"role": "user", "content": "Hello world"}], "stream": True, **GREEDY, "max_tokens": 64,
            "ban_eos_token": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{llama_api.url}/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(p) for p in sse_payloads(response)[:-1]]
    elapsed = time.perf_counter() - started
    contents = [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(contents) == expected_chat_reply("Hello world", max_new_tokens=64, ban_eos_token=True)[0]
    assert len(contents) <= elapsed * 50 + 3, (len(contents), elapsed)


def test_stream_through_the_openai_client(llama_api):
    stream = llama_api.client().chat.completions.create(messages=[{"role": "user", "content": "Hello"}], stream=True,
                                                        **GREEDY)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == expected_chat_reply("Hello")[0]


def test_completions_stream_and_not(llama_api):
    client = llama_api.client()
    result = client.completions.create(prompt="The quick brown fox", **GREEDY)
    state = host_helpers.greedy_state(max_new_tokens=10)
    expected = list(generate_reply("The quick brown fox", state))[-1]
    assert result.choices[0].text == expected
    assert result.usage.prompt_tokens == len(encode("The quick brown fox")[0])
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt="The quick brown fox", stream=True,
                                                                            **GREEDY))
    assert streamed == expected


def test_stop_strings_cut_the_reply(llama_api):
    client = llama_api.client()
    full = client.completions.create(prompt="Hello world", model="any", temperature=0, max_tokens=30,
                                     extra_body={"ban_eos_token": True}).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    cut = client.completions.create(prompt="Hello world", model="any", temperature=0, max_tokens=30, stop=[stop],
                                    extra_body={"ban_eos_token": True})
    assert cut.choices[0].text == full[:full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_repeatable(llama_api):
    client = llama_api.client()
    kwargs = dict(model="any", prompt="Hello", max_tokens=12, temperature=1.0, top_p=1.0, seed=7,
                  extra_body={"ban_eos_token": True})
    first, second = (client.completions.create(**kwargs).choices[0].text for _ in range(2))
    assert first == second
    others = {client.completions.create(**dict(kwargs, seed=s)).choices[0].text for s in range(8, 12)}
    assert len(others | {first}) > 1, "different seeds give different samples"



def test_seeds_take_64_bits(llama_api):
    """OpenAI clients and text-generation-webui take any 64-bit seed; NumPy's generator, which takes 32,
    must not refuse one."""
    client = llama_api.client()
    kwargs = dict(model="any", prompt="Hello", max_tokens=12, temperature=1.0, top_p=1.0,
                  extra_body={"ban_eos_token": True})
    for seed in (5_000_000_000, 2**64 - 1, -2):
        first, second = (client.completions.create(**kwargs, seed=seed).choices[0].text for _ in range(2))
        assert first == second, seed
    response = httpx.post(f"{llama_api.url}/completions", json={"prompt": "Hello", "seed": 2**64}, timeout=60)
    assert response.status_code == 422 and response.json()["error"]["param"] == "seed"


def test_null_stream_and_n_empty_prompts_and_tiny_temperatures_are_taken(llama_api):
    """OpenAI's schema lets `stream` and `n` be null and the prompt be empty; a temperature too small to
    divide by samples at vLLM's smallest (0.01)."""
    for path, body in (("chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "stream": None,
                                             "n": None}),
                       ("completions", {"prompt": "", "stream": None}),
                       ("chat/completions", {"messages": [{"role": "user", "content": "Hello"}],
                                             "temperature": 1e-38, "seed": 3})):
        response = httpx.post(f"{llama_api.url}/{path}", json={"max_tokens": 4, **body}, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["object"] != "chat.completion.chunk"
    greedy = llama_api.client().chat.completions.create(messages=[{"role": "user", "content": "Hello"}], **GREEDY)
    tiny = llama_api.client().chat.completions.create(messages=[{"role": "user", "content": "Hello"}],
                                                      **{**GREEDY, "temperature": 1e-30})
    assert tiny.choices[0].message.content == greedy.choices[0].message.content, "0.01 samples the greedy tokens"


@pytest.fixture(scope="module")
def sampler_defaults_api(sampler_defaults_llama_dir):
    with api_helpers.serving(sampler_defaults_llama_dir) as api:
        yield api


def completion_text(api: api_helpers.LiveAPI, **params) -> str:
    """16 tokens after "Hello world" (EOS banned), with the request's `params`."""
    body = {"prompt": "Hello world", "max_tokens": 16, "ban_eos_token": True, **params}
    return api.post("/completions", json=body).json()["choices"][0]["text"]


def test_the_requests_repetition_penalty_applies_never_the_checkpoints(sampler_defaults_api,
                                                                        sampler_defaults_llama_dir):
    """The checkpoint's generation_config.json says repetition_penalty 1.05 (as Qwen2's do): a request that
    says 1.0 gets 1.0, as in text-generation-webui, and one that says nothing the host's setting (1.0)."""
    plain, penalised = (host_helpers.hf_continuation(sampler_defaults_llama_dir, "Hello world", 16, do_sample=False,
                                                     **penalty) for penalty in ({"repetition_penalty": 1.0}, {}))
    assert plain != penalised, "the checkpoint's penalty changes this reply"
    assert completion_text(sampler_defaults_api, temperature=0, repetition_penalty=1.0) == plain
    assert completion_text(sampler_defaults_api, temperature=0) == plain
    assert completion_text(sampler_defaults_api, temperature=0, repetition_penalty=1.05) == penalised


def test_a_sampled_request_uses_its_own_samplers_only(sampler_defaults_api, sampler_defaults_llama_dir, llama_dir):
    """Sampling draws what Hugging Face draws from the same weights and seed with the request's temperature,
    top_p and top_k and no checkpoint defaults (`llama_dir`); the checkpoint's top_k 20, min_p and typical_p
    would draw something else."""
    sampling = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, seed=7)
    expected = host_helpers.hf_continuation(llama_dir, "Hello world", 16, **sampling)
    with_defaults = host_helpers.hf_continuation(sampler_defaults_llama_dir, "Hello world", 16, **sampling,
                                                 repetition_penalty=1.0)
    assert expected != with_defaults, "the checkpoint's samplers change this sample"
    assert completion_text(sampler_defaults_api, temperature=1.0, top_p=1.0, top_k=0, seed=7) == expected


def test_max_tokens_bounds_the_reply(llama_api):
    result = llama_api.client().completions.create(prompt="Hello", model="any", temperature=0, max_tokens=3,
                                                   extra_body={"ban_eos_token": True})
    assert result.usage.completion_tokens == 3 and result.choices[0].finish_reason == "length"


def test_models_lists_the_loaded_model(llama_api):
    models = llama_api.client().models.list()
    assert [m.id for m in models.data] == [shared.model_name]
    assert llama_api.client().models.retrieve(shared.model_name).id == shared.model_name


def test_concurrent_requests_queue_and_none_is_lost(llama_api):
    prompts = [f"Question number {i} about a red circle?" for i in range(4)]
    expected = [expected_chat_reply(p)[0] for p in prompts]
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        reply = llama_api.client().chat.completions.create(messages=[{"role": "user", "content": prompts[i]}], **GREEDY)
        results[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results.get(i) for i in range(len(prompts))] == expected


def test_disconnect_mid_stream_stops_the_generation(llama_api, caplog):
    body = {"prompt": "Hello world", "stream": True, "max_tokens": 900, "temperature": 0, "ban_eos_token": True}
    with caplog.at_level(logging.INFO, logger="text-generation-webui"):
        with httpx.stream("POST", f"{llama_api.url}/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6))]
        assert any(line.startswith("data: ") for line in received)
        assert api_helpers.wait_until_unlocked(), "the generation lock is still held after the client left"
        stopped = [r.getMessage() for r in caplog.records if "client disconnected" in r.getMessage()]
    assert stopped, "the server noticed the disconnect"
    tokens = int(re.search(r"after (\d+) tokens", stopped[-1]).group(1))
    assert tokens < 900
    after = llama_api.client().completions.create(prompt="Hello", **GREEDY)
    assert after.usage.completion_tokens >= 1


def test_images_need_the_multimodal_extension(llama_api):
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": api_helpers.data_url(api_helpers.image_bytes())}}]
    with pytest.raises(openai.BadRequestError) as raised:
        llama_api.client().chat.completions.create(messages=[{"role": "user", "content": content}], **GREEDY)
    assert "cannot take images" in raised.value.body["message"]


# -- Images (tiny llava-hf model + the multimodal extension) -----------------------------------------

def image_message(data: bytes, text: str = "What is in the picture?") -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": api_helpers.data_url(data)}},
                                        {"type": "text", "text": text}]}


def expected_image_reply(data: bytes, text: str = "What is in the picture?") -> tuple[str, dict]:
    import extensions.multimodal.script as multimodal

    return expected_chat_reply(f"{multimodal.image_to_history_tag(data)}\n{text}")


def test_chat_with_a_data_url_image(llava_api):
    data = api_helpers.image_bytes("red", "circle")
    result = llava_api.client().chat.completions.create(messages=[image_message(data)], **GREEDY)
    expected, stats = expected_image_reply(data)
    assert result.choices[0].message.content == expected
    assert result.usage.prompt_tokens == stats["prompt_tokens"]
    text_only = llava_api.client().chat.completions.create(
        messages=[{"role": "user", "content": "What is in the picture?"}], **GREEDY)
    # 16 image tokens replace one tag (plus a newline) in the tiny llava model.
    assert result.usage.prompt_tokens >= text_only.usage.prompt_tokens + 16


def test_chat_image_reply_equals_hugging_face_generate(llava_api):
    """The oracle: transformers' own generate(**processor(text, images)) on the same prompt and picture."""
    import base64

    import torch

    import extensions.multimodal.script as multimodal
    from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, decode_image_bytes

    data = api_helpers.image_bytes("green", "triangle")
    result = llava_api.client().chat.completions.create(messages=[image_message(data)], **GREEDY)
    tag = multimodal.image_to_history_tag(data)
    picture = decode_image_bytes(base64.b64decode(IMAGE_TAG_RE.fullmatch(tag).group("data")))  # the PNG as sent
    state = host_helpers.greedy_state()
    prompt = chat.generate_chat_prompt("<image>\nWhat is in the picture?", state, history=chat.new_history())
    inputs = host_helpers.hf_processor()(text=prompt, images=[picture], return_tensors="pt")
    with torch.inference_mode():
        output = shared.model.generate(**inputs, max_new_tokens=10, do_sample=False,
                                       pad_token_id=shared.tokenizer.pad_token_id)
    expected = shared.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert result.choices[0].message.content == expected.lstrip(" ")
    assert result.usage.prompt_tokens == inputs["input_ids"].shape[1]


def test_chat_stream_with_an_image(llava_api):
    data = api_helpers.image_bytes("blue", "square")
    stream = llava_api.client().chat.completions.create(messages=[image_message(data)], stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected_image_reply(data)[0]


def test_two_images_give_different_prompts(llava_api):
    client = llava_api.client()
    red = client.chat.completions.create(messages=[image_message(api_helpers.image_bytes("red"))], **GREEDY)
    green = client.chat.completions.create(messages=[image_message(api_helpers.image_bytes("green", "square"))],
                                           **GREEDY)
    assert red.choices[0].message.content == expected_image_reply(api_helpers.image_bytes("red"))[0]
    assert green.choices[0].message.content == expected_image_reply(api_helpers.image_bytes("green", "square"))[0]


def test_legacy_message_image_url_field(llava_api):
    data = api_helpers.image_bytes("red", "triangle")
    legacy = {"role": "user", "content": "What is in the picture?", "image_url": api_helpers.data_url(data)}
    result = llava_api.client().chat.completions.create(messages=[legacy], **GREEDY)
    assert result.choices[0].message.content == expected_image_reply(data)[0]


def test_completions_with_an_img_tag(llava_api):
    import extensions.multimodal.script as multimodal

    tag = multimodal.image_to_history_tag(api_helpers.image_bytes("red", "circle"))
    assert re.fullmatch(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+">', tag)  # a PNG, kept as sent
    prompt = f"USER: {tag}\nWhat is in the picture?\nASSISTANT:"
    client = llava_api.client()
    result = client.completions.create(prompt=prompt, **GREEDY)
    state = host_helpers.greedy_state(max_new_tokens=10)
    expected = list(generate_reply(prompt, state))[-1]
    assert result.choices[0].text == expected
    assert result.usage.prompt_tokens == state["generation_stats"]["prompt_tokens"]
    assert result.usage.prompt_tokens >= 16
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **GREEDY))
    assert streamed == expected


def test_undecodable_image_is_400(llava_api):
    for url in ("data:image/png;base64,aGVsbG8gd29ybGQ=", "data:image/png;base64,!!!notbase64"):
        response = llava_api.post("/chat/completions", json={"messages": [image_message(b"")], **GREEDY} | {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert llava_api.client().chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **GREEDY)


def test_images_lost_to_truncation_come_with_a_warning(llava_api, caplog):
    import extensions.multimodal.script as multimodal

    first, second = (multimodal.image_to_history_tag(api_helpers.image_bytes(c)) for c in ("red", "blue"))
    body = {"prompt": f"{first}\n{second}\nWhat is this?", "model": "any", "temperature": 0, "max_tokens": 4}
    fits = llava_api.post("/completions", json=body)
    assert fits.status_code == 200 and "warnings" not in fits.json(), "both images fit"
    # Room for one image (16 tokens) and the text, not for both.
    body["truncation_length"] = body["max_tokens"] + fits.json()["usage"]["prompt_tokens"] - 8
    with caplog.at_level(logging.WARNING, logger="text-generation-webui"):
        response = llava_api.post("/completions", json=body)
    assert response.status_code == 200, response.text
    warnings = response.json().get("warnings")
    assert warnings and "Removed 1 image" in warnings[0]
    assert response.json()["usage"]["prompt_tokens"] <= fits.json()["usage"]["prompt_tokens"] - 16
    assert any("Removed 1 image" in r.getMessage() and "cmpl-" in r.getMessage() for r in caplog.records)
    with httpx.stream("POST", f"{llava_api.url}/completions", json={**body, "stream": True}, timeout=60) as streamed:
        chunks = [json.loads(p) for p in sse_payloads(streamed)[:-1]]
    assert chunks[-1]["warnings"] == warnings


def test_readme_examples_run(llava_api, tmp_path, monkeypatch):
    """The curl (data URL) and Python examples in modules/api/README.md, against the live server."""
    import shutil
    import subprocess

    readme = (ROOT / "modules" / "api" / "README.md").read_text()
    blocks = re.findall(r"```(bash|python)\n(.*?)```", readme, re.S)
    port = llava_api.url.split(":")[-1].split("/")[0]
    (tmp_path / "picture.png").write_bytes(api_helpers.image_bytes("red", "circle", size=64))
    monkeypatch.chdir(tmp_path)
    curl_block = next(code for lang, code in blocks if lang == "bash" and "-d @request.json" in code)
    if shutil.which("curl"):
        done = subprocess.run(["bash", "-c", curl_block.replace("5000", port)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer.get("object") == "chat.completion" and answer["usage"]["prompt_tokens"] >= 16, done.stdout
    python_block = next(code for lang, code in blocks if lang == "python")
    exec(compile(python_block.replace("5000", port), "README.md", "exec"), {})
