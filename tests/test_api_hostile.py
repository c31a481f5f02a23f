"""Hostile input to the API: each case gets its status code and OpenAI-shaped error, and the next
normal request still succeeds (no leaked lock, no stuck worker).

Remote images come from `tests/image_server.py` on 127.0.0.1. The address check is injected
(`APIConfig.address_allowed`) so one API instance accepts exactly that server's port while every
other loopback/private address - including redirect targets - stays refused.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
import torch

from modules import shared
from modules.api.capped_read import TooLarge, read_capped
from modules.api.config import APIConfig, is_public_address
from modules.api.errors import APIError
from modules.api import image_fetch
from modules.api.image_fetch import fetch_image_bytes
from modules.message_memo import MessageMemo
from fixtures import api_helpers, host_helpers
from tests.image_server import BIG_BYTES, ImageServer

ROOT = Path(__file__).resolve().parent.parent
GREEDY = {"model": "any", "temperature": 0, "max_tokens": 6}
HELLO = {"messages": [{"role": "user", "content": "Hello"}], **GREEDY}
PNG = api_helpers.image_bytes("red", "circle")
DATA_URL_BYTES = image_fetch.data_url_bytes


def allow_only_port(port: int):
    """Public addresses, plus 127.0.0.1:port (the test image server) and nothing else local."""
    def allowed(ip, p: int) -> bool:
        return is_public_address(ip, p) or (ip == ipaddress.ip_address("127.0.0.1") and p == port)
    return allowed


@pytest.fixture(scope="module")
def image_server():
    server = ImageServer(PNG).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llava_apis(llava_dir, image_server):
    """(default API, API that may fetch from the test image server only, with a 1 s timeout and small caps)."""
    saved = host_helpers.snapshot()
    host_helpers.load(llava_dir, ["multimodal"])
    apis = (api_helpers.start_api(),
            api_helpers.start_api(APIConfig(address_allowed=allow_only_port(image_server.port),
                                            fetch_timeout_s=1.0, max_image_bytes=BIG_BYTES // 2)))
    yield apis
    for api in apis:
        api.stop()
    host_helpers.restore(saved)


def assert_error(response: httpx.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    return error


def assert_still_serving(api: api_helpers.LiveAPI) -> None:
    assert api_helpers.wait_until_unlocked(), "the generation lock leaked"
    response = api.post("/chat/completions", json=HELLO)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def image_body(url: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                      {"type": "image_url", "image_url": {"url": url}}]}], **GREEDY}


# -- Malformed requests ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, words", [
    (b"{", ["not valid JSON"]),
    (b"", ["not valid JSON"]),
    (b"\xff\xfe garbage", ["not valid JSON"]),
    (b"[1, 2]", ["must be a JSON object", "list"]),
    (b"null", ["must be a JSON object"]),
])
def test_malformed_json_is_400(llama_api, body, words):
    response = llama_api.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(response, 400, *words)
    assert_still_serving(llama_api)


def lone_surrogate_body(text: str, **fields) -> bytes:
    """JSON as JavaScript writes a string cut inside an emoji's pair: `"\\ud83d"`, escaped, alone."""
    messages = [{"role": "user", "content": "Hi " + text}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": text}]
    return json.dumps({"messages": messages, **GREEDY, **fields}).encode()


def test_a_lone_utf16_surrogate_is_read_as_the_replacement_character(llama_api):
    """Python's json writes "\\ud83d" for it too; pydantic's parser refuses it, as "unexpected end of hex
    escape". A chat that holds one is answered as the same chat with U+FFFD in its place."""
    cut = "Tell me about \ud83d"  # the first half of 😀
    answers = [llama_api.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
               for body in (lone_surrogate_body(cut), lone_surrogate_body(cut.replace("\ud83d", "\ufffd")))]
    assert b"\\ud83d" in lone_surrogate_body(cut)
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert answers[0].json()["choices"] == answers[1].json()["choices"]
    assert answers[0].json()["usage"] == answers[1].json()["usage"]
    low_half = json.dumps({"prompt": "after \ude00 ... \ud83d\ude00", "max_tokens": 4, "temperature": 0}).encode()
    response = llama_api.post("/completions", content=low_half, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    invalid = llama_api.post("/chat/completions", content=lone_surrogate_body(cut, temperature="hot"),
                             headers={"Content-Type": "application/json"})
    assert assert_error(invalid, 422, "temperature")["param"] == "temperature"


@pytest.mark.parametrize("change, param", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"seed": 1.5}, "seed"),
    ({"messages": "Hello"}, "messages"),
    ({"messages": []}, "messages"),
])
def test_invalid_parameters_are_422(llama_api, change, param):
    response = llama_api.post("/chat/completions", json={**HELLO, **change})
    error = assert_error(response, 422, param)
    assert error["param"] == param or error["param"].startswith(param)
    assert_still_serving(llama_api)


def test_a_parameter_of_several_types_is_named_as_sent_with_each_reason(llama_api):
    """`stop` is a string or a list: pydantic tries both, and names each try (`stop.str`, `stop.list[str]`)."""
    error = assert_error(llama_api.post("/chat/completions", json={**HELLO, "stop": 5}), 422,
                         "valid string, or Input should be a valid array", "(got 5)")
    assert error["param"] == "stop"
    error = assert_error(llama_api.post("/chat/completions", json={**HELLO, "stop": ["a", 3]}), 422, "'stop.1'")
    assert error["param"] == "stop"


def test_a_stop_string_may_be_longer_than_16_characters(llama_api):
    """At most 16 stop strings; each of any length (Llama 3's `<|start_header_id|>` has 19 characters)."""
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "ban_eos_token": True}
    whole = llama_api.post("/completions", json=body)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["text"]
    stop = text[4:4 + 17] if len(text) >= 21 else text[2:]  # a long piece of the reply, to stop at
    cut = llama_api.post("/completions", json={**body, "stop": "<|start_header_id|>"})
    assert cut.status_code == 200, cut.text
    assert cut.json()["choices"][0]["text"] == text
    cut = llama_api.post("/completions", json={**body, "stop": stop})
    assert cut.json()["choices"][0]["text"] == text[:text.index(stop)], (stop, text)


def test_a_too_short_context_blames_what_the_request_set(llama_api):
    error = assert_error(llama_api.post("/chat/completions", json={"messages": HELLO["messages"],
                                                                    "truncation_length": 1}), 422, "truncation_length")
    assert error["param"] == "truncation_length"
    error = assert_error(llama_api.post("/chat/completions", json={**HELLO, "max_tokens": 64, "truncation_length": 64}),
                         422)
    assert error["param"] == "max_tokens"


def test_turns_left_out_to_fit_are_counted_and_a_cut_turn_is_told(llama_api):
    turns = [{"role": role, "content": f"Turn {i} says hello to the model, once more."}
             for i in range(12) for role in ("user", "assistant")][:-1]
    whole = llama_api.post("/chat/completions", json={**HELLO, "messages": turns})
    assert whole.status_code == 200 and "dropped_turns" not in whole.json(), whole.text
    short = llama_api.post("/chat/completions", json={**HELLO, "messages": turns, "truncation_length": 256})
    body = short.json()
    assert short.status_code == 200 and 0 < body["dropped_turns"] < 11, short.text
    assert "warnings" not in body  # no picture was left out: the count says it, as text-generation-webui is silent
    assert body["usage"]["prompt_tokens"] <= 256 - GREEDY["max_tokens"] < whole.json()["usage"]["prompt_tokens"]
    alone = llama_api.post("/chat/completions", json={**HELLO, "messages": [{"role": "user", "content": "Hi " * 200}],
                                                       "truncation_length": 96})
    assert alone.status_code == 200, alone.text
    assert alone.json()["usage"]["prompt_tokens"] == 96 - GREEDY["max_tokens"]
    assert any("cut to its last 90 tokens" in w for w in alone.json()["warnings"]), alone.text


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user", "content": 42}], ["messages[0].content", "int"]),
    ([{"role": "user", "content": ["just a string"]}], ["content[0]", "str"]),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], ["'input_audio'", "'text'"]),
    ([{"role": "user", "content": [{"type": "text"}]}], ["text part"]),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 7}}]}], ["image_url"]),
    ([{"role": "user", "content": [{"type": "image_url"}]}], ["image_url"]),
    ([{"role": "tool", "content": "x"}], ["unsupported role 'tool'", "calls no tools"]),
    ([{"content": "x"}], ["unsupported role None"]),
    ([{"role": "user"}], ["needs a 'content'"]),
    ([{"role": "system", "content": "only a system message"}], ["no user or assistant"]),
    ([{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}],
     ["user messages only"]),
])
def test_malformed_messages_are_400(llama_api, messages, words):
    response = llama_api.post("/chat/completions", json={**GREEDY, "messages": messages})
    assert_error(response, 400, *words)
    assert_still_serving(llama_api)


def test_too_many_images_are_refused_before_any_fetch(llama_api):
    parts = [{"type": "image_url", "image_url": {"url": f"http://example.invalid/{i}.png"}} for i in range(33)]
    response = llama_api.post("/chat/completions", json={**GREEDY, "messages": [{"role": "user", "content": parts}]})
    assert_error(response, 400, "33 images", "at most 32")
    assert_still_serving(llama_api)


def test_completions_take_one_prompt(llama_api):
    assert_error(llama_api.post("/completions", json={"prompt": ["a", "b"], **GREEDY}), 422, "2 prompts")
    assert llama_api.post("/completions", json={"prompt": ["a"], **GREEDY}).status_code == 200


def test_huge_bodies_are_413(llama_api):
    huge = json.dumps({**HELLO, "messages": [{"role": "user", "content": "x" * (21 * 1024 * 1024)}]}).encode()
    assert_error(llama_api.post("/chat/completions", content=huge), 413, "20971520-byte limit")

    def chunks():  # no Content-Length: the cap is enforced while reading
        for _ in range(22):
            yield b"x" * (1024 * 1024)
    assert_error(llama_api.post("/completions", content=chunks()), 413, "limit")
    assert_still_serving(llama_api)


def test_a_capped_read_takes_the_limit_and_not_a_byte_more():
    async def chunks(*parts: bytes):
        for part in parts:
            yield part

    def read(content_length: str | None, *parts: bytes) -> bytes:
        return asyncio.run(read_capped(chunks(*parts), content_length, 4))

    assert read(None, b"ab", b"cd") == b"abcd" and read("4", b"abcd") == b"abcd"
    assert read("many", b"ab") == b"ab", "a header that is no number is left to the bytes read"
    with pytest.raises(TooLarge) as raised:
        read(None, b"ab", b"cde")
    assert (raised.value.size, raised.value.declared) == (5, False)
    with pytest.raises(TooLarge) as raised:
        read("5")  # refused before a byte is read
    assert (raised.value.size, raised.value.declared) == (5, True)


def test_unknown_routes_are_404(llama_api):
    for method, path in (("GET", "/v1/nope"), ("POST", "/v1/engines/x/completions"), ("GET", "/")):
        response = httpx.request(method, llama_api.url.removesuffix("/v1") + path)
        assert_error(response, 404, "Unknown route")
    refused = httpx.get(f"{llama_api.url}/chat/completions")
    assert_error(refused, 405)
    assert refused.headers["allow"] == "POST"
    assert_still_serving(llama_api)


def test_a_page_from_another_origin_may_call_the_api(llama_api):
    """As text-generation-webui's API: a browser's preflight is answered for any origin, and so is the
    request that follows (chat front-ends that run in the page)."""
    origin = {"Origin": "http://chat.example"}
    preflight = httpx.options(f"{llama_api.url}/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-origin"] == "http://chat.example"
    answer = llama_api.post("/chat/completions", json=HELLO, headers=origin)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://chat.example"


# -- Remote image URLs, at the fetch layer (no model needed) ----------------------------------------

def fetch(url: str, config: APIConfig | None = None) -> bytes:
    return asyncio.run(fetch_image_bytes(url, config or APIConfig()))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "0x7f000001", "2130706433", "127.1",
                                  "[::ffff:127.0.0.1]", "169.254.169.254", "10.0.0.1", "192.168.1.1", "0.0.0.0"])
def test_local_and_private_addresses_are_refused(image_server, host):
    before = len(image_server.requests)
    with pytest.raises(APIError) as raised:
        fetch(f"http://{host}:{image_server.port}/image.png")
    assert raised.value.status == 400 and "request forgery" in raised.value.message
    assert "--api-allow-private-urls" in raised.value.message
    assert len(image_server.requests) == before, "refused before connecting"


def test_allowed_address_fetches_the_bytes(image_server):
    assert fetch(image_server.url("/image.png"), APIConfig(address_allowed=allow_only_port(image_server.port))) == PNG


@pytest.mark.parametrize("target", ["http://127.0.0.1:{other}/image.png", "http://169.254.169.254/latest/meta-data",
                                    "http://[::1]:{port}/image.png", "https://10.1.2.3/x.png", "file:///etc/passwd",
                                    "ftp://127.0.0.1:{port}/image.png"])
def test_redirects_are_checked_again(image_server, target):
    config = APIConfig(address_allowed=allow_only_port(image_server.port))
    target = target.format(port=image_server.port, other=image_server.port + 1)
    with pytest.raises(APIError) as raised:
        fetch(image_server.url(f"/redirect?to={target}"), config)
    assert raised.value.status == 400
    assert "request forgery" in raised.value.message or "unsupported scheme" in raised.value.message
    # A redirect to an allowed place still works, through several hops.
    hop = image_server.url("/image.png")
    for _ in range(3):
        hop = image_server.url(f"/redirect?to={hop}")
    assert fetch(hop, config) == PNG


def test_redirect_loops_stop(image_server):
    config = APIConfig(address_allowed=allow_only_port(image_server.port), max_redirects=2)
    url = image_server.url("/image.png")
    for _ in range(3):
        url = image_server.url(f"/redirect?to={url}")
    with pytest.raises(APIError, match="more than 2 times"):
        fetch(url, config)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://example.com/",
                                 "javascript:alert(1)", "/relative.png", "example.com/a.png"])
def test_unsupported_schemes_are_refused(url):
    with pytest.raises(APIError, match="Unsupported image URL scheme") as raised:
        fetch(url)
    assert raised.value.status == 400


def test_slow_remote_image_times_out(image_server):
    config = APIConfig(address_allowed=allow_only_port(image_server.port), fetch_timeout_s=0.5)
    with pytest.raises(APIError, match="longer than 0.5 s"):
        fetch(image_server.url("/slow"), config)


@pytest.mark.parametrize("path", ["/big", "/big-declared"])
def test_oversized_remote_image_is_413(image_server, path):
    config = APIConfig(address_allowed=allow_only_port(image_server.port), max_image_bytes=BIG_BYTES // 2)
    with pytest.raises(APIError) as raised:
        fetch(image_server.url(path), config)
    assert raised.value.status == 413 and "limit" in raised.value.message


@pytest.mark.parametrize("path,words", [("/cut-short", "RemoteProtocolError"), ("/bad-gzip", "DecodingError")])
def test_a_body_that_cannot_be_read_is_400(image_server, path, words):
    with pytest.raises(APIError, match=f"body could not be read: {words}") as raised:
        fetch(image_server.url(path), APIConfig(address_allowed=allow_only_port(image_server.port)))
    assert raised.value.status == 400


def test_a_port_out_of_range_is_400():
    with pytest.raises(APIError, match="the port 99999, outside 1-65535") as raised:
        fetch("http://93.184.215.14:99999/x.png")
    assert raised.value.status == 400


def test_data_urls_are_capped_and_checked():
    url = api_helpers.data_url(b"\0" * 4096)
    with pytest.raises(APIError) as raised:
        fetch(url, APIConfig(max_image_bytes=1024))
    assert raised.value.status == 413
    assert fetch(url, APIConfig(max_image_bytes=8192)) == b"\0" * 4096
    for bad, words in (("data:image/png;base64,@@@", "cannot be decoded"), ("data:image/png;base64", "no ','"),
                       ("data:text/html;base64,PGI+", "not an image"), ("data:image/png;base64,", "no data")):
        with pytest.raises(APIError, match=words):
            fetch(bad)


def test_a_data_url_sent_again_is_not_decoded_again_under_the_same_cap(monkeypatch):
    """An OpenAI-style client sends every picture again with each request (counted at the decode)."""
    decoded = []
    monkeypatch.setattr(image_fetch, "DECODED", MessageMemo(max_chars=2**20))
    monkeypatch.setattr(image_fetch, "data_url_bytes", lambda *a: decoded.append(a[0]) or DATA_URL_BYTES(*a))
    url, other = api_helpers.data_url(b"\1" * 4096), api_helpers.data_url(b"\2" * 4096)
    assert fetch(url) == fetch("".join([url[:9], url[9:]])) == b"\1" * 4096  # an equal string, as a request's
    assert fetch(other) == b"\2" * 4096 and decoded == [url, other]
    with pytest.raises(APIError) as raised:
        fetch(url, APIConfig(max_image_bytes=1024))
    assert raised.value.status == 413
    for _ in range(2):
        with pytest.raises(APIError, match="cannot be decoded"):
            fetch("data:image/png;base64,@@@")
    assert len(decoded) == 5, "a refused URL is decoded, and refused, every time"


# -- Through the API with the multimodal extension ------------------------------------------------------

def test_loopback_url_is_refused_by_default(llava_apis, image_server):
    default_api, _ = llava_apis
    before = len(image_server.requests)
    error = assert_error(default_api.post("/chat/completions", json=image_body(image_server.url("/image.png"))), 400,
                         "request forgery")
    assert error["code"] == "url_not_allowed"
    assert len(image_server.requests) == before
    assert_still_serving(default_api)


def test_remote_fetch_failures_map_to_status_codes(llava_apis, image_server):
    _, api = llava_apis
    cases = [("/slow", 400, "longer than"), ("/big", 413, "limit"), ("/big-declared", 413, "limit"),
             ("/missing.png", 400, "HTTP 404"),
             (f"/redirect?to=http://127.0.0.1:{image_server.port + 1}/image.png", 400, "request forgery"),
             ("/redirect?to=file:///etc/passwd", 400, "unsupported scheme")]
    for path, status, words in cases:
        assert_error(api.post("/chat/completions", json=image_body(image_server.url(path))), status, words)
        assert_still_serving(api)
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x.png"):
        assert_error(api.post("/chat/completions", json=image_body(url)), 400, "Unsupported image URL scheme")
    assert_error(api.post("/chat/completions", json=image_body(api_helpers.data_url(b"\0" * BIG_BYTES))), 413)
    assert_still_serving(api)


def test_a_picture_budget_none_of_those_accepted_is_refused_with_or_without_a_picture(llava_apis):
    default_api, _ = llava_apis
    for body in (HELLO, image_body(api_helpers.data_url(PNG))):
        error = assert_error(default_api.post("/chat/completions", json={**body, "image_budget": "bogus"}), 400,
                             "'default', 'low', 'high'", "'bogus'")
        assert (error["param"], error["code"]) == ("image_budget", "invalid_parameter")
    assert_still_serving(default_api)


def test_undecodable_image_is_400(llava_apis):
    default_api, _ = llava_apis
    for data in (b"this is not an image", PNG[:40]):
        error = assert_error(default_api.post("/chat/completions", json=image_body(api_helpers.data_url(data))), 400)
        assert error["code"] == "invalid_image"
    assert_still_serving(default_api)


def test_remote_image_equals_the_same_data_url(llava_apis, image_server):
    _, api = llava_apis
    by_url = api.post("/chat/completions", json=image_body(image_server.url("/image.png")))
    by_data = api.post("/chat/completions", json=image_body(api_helpers.data_url(PNG)))
    assert by_url.status_code == by_data.status_code == 200, by_url.text
    assert by_url.json()["choices"] == by_data.json()["choices"]
    assert by_url.json()["usage"] == by_data.json()["usage"]


def test_pipeline_failure_is_500_and_frees_the_lock(llava_apis, monkeypatch):
    import extensions.multimodal.script as multimodal

    default_api, _ = llava_apis
    pipeline = multimodal.served_model.embedder(multimodal.params).pipeline

    def out_of_memory(images, **prepared):  # as the pipeline is called (prepared inputs too)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")

    monkeypatch.setattr(pipeline, "embed_images", out_of_memory)
    fresh = api_helpers.data_url(api_helpers.image_bytes("purple", "square"))  # not in the embedding cache
    for stream in (False, True):
        response = default_api.post("/chat/completions", json={**image_body(fresh), "stream": stream})
        error = assert_error(response, 500, "OutOfMemoryError", "simulated")
        assert error["type"] == "server_error"
        assert not shared.generation_lock.locked()
    monkeypatch.undo()
    assert_still_serving(default_api)


def test_disconnect_mid_stream_frees_the_lock(llama_api):
    body = {"messages": [{"role": "user", "content": "Hello"}], "stream": True, "max_tokens": 900,
            "temperature": 0, "ban_eos_token": True}
    with httpx.stream("POST", f"{llama_api.url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        next(response.iter_lines())
        assert shared.generation_lock.locked()
    assert_still_serving(llama_api)


def test_a_waiting_client_that_leaves_stops_its_generation(llama_api, caplog):
    """A non-streaming request whose client hangs up mid-generation stops at the next token."""
    body = json.dumps({"prompt": "Hello world", "max_tokens": 900, "temperature": 0, "ban_eos_token": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with caplog.at_level(logging.INFO, logger="text-generation-webui"):
        with socket.create_connection(("127.0.0.1", llama_api.server.port)) as raw:
            raw.sendall(head + body)
            for _ in range(500):  # until the generation holds the lock
                if shared.generation_lock.locked():
                    break
                time.sleep(0.01)
            assert shared.generation_lock.locked()
        assert api_helpers.wait_until_unlocked()
        stopped = [r.getMessage() for r in caplog.records if "client disconnected" in r.getMessage()]
    assert stopped and int(re.search(r"after (\d+) tokens", stopped[-1]).group(1)) < 900
    assert_still_serving(llama_api)
