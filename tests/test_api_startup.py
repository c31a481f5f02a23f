"""Starting and configuring the API: command-line flags, the API key, serving without a model.

These tests load models with the function-scoped `host` fixture, whose clean-up unloads extensions,
so they live apart from the module-scoped live servers of test_api.py."""
from __future__ import annotations

import ipaddress

import httpx
import openai
import pytest

from modules import shared
from modules.api import server as api_server
from modules.api.config import APIConfig, bind_host, config_from_args
from fixtures import api_helpers

GREEDY = dict(model="any", temperature=0, max_tokens=10)


def test_start_in_background_applies_the_flags(llama_dir, host):
    port = api_helpers.free_port()
    host.load(llama_dir, argv=["--api", "--api-port", str(port), "--api-key", "k1", "--nowebui"])
    background = api_server.start_in_background()
    try:
        assert (background.host, background.port) == ("127.0.0.1", port)
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer k1"}).json()["data"][0]["id"] == shared.model_name
        with pytest.raises(RuntimeError, match="port in use"):
            api_server.start_in_background()  # the same port again
    finally:
        background.stop()
    assert bind_host(shared.parse_args(["--listen"])) == "0.0.0.0"
    assert bind_host(shared.parse_args(["--listen", "--listen-host", "192.168.1.5"])) == "192.168.1.5"
    assert bind_host(shared.parse_args(["--listen-host", "192.168.1.5"])) == "127.0.0.1"


def test_private_urls_flag_lifts_the_address_check():
    loopback = ipaddress.ip_address("127.0.0.1")
    assert not config_from_args(shared.parse_args([])).address_allowed(loopback, 80)
    assert config_from_args(shared.parse_args(["--api-allow-private-urls"])).address_allowed(loopback, 80)


def test_api_key_is_required_when_set(llama_dir, host):
    host.load(llama_dir)
    api = api_helpers.start_api(APIConfig(api_key="sekrit"))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            response = httpx.get(f"{api.url}/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=api.url, api_key="wrong", max_retries=0).models.list()
        assert api.client().models.list().data[0].id == shared.model_name
        reply = api.client().chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **GREEDY)
        assert reply.choices[0].message.content is not None
    finally:
        api.stop()


def test_no_model_is_503(host):
    shared.model = None
    api = api_helpers.start_api()
    try:
        with pytest.raises(openai.InternalServerError) as raised:
            api.client().chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **GREEDY)
        assert raised.value.status_code == 503
        assert "No model is loaded" in raised.value.body["message"]
        assert api.client().models.list().data == []
    finally:
        api.stop()
