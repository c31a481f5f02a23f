"""One guarded fetcher for the host's API and for extensions.

`modules.web_search.safe_get` (the name text-generation-webui's extensions import) runs the API's
fetcher, so an extension's image URL meets the same private-address guard, under the same
`--api-allow-private-urls` setting, as an API `image_url`. Real HTTP against `tests/image_server.py`
on 127.0.0.1, a loopback (private) address: refused by default, fetched when the setting allows it.
The redirect, timeout and byte-cap cases of the shared core are in tests/test_api_hostile.py.
"""
from __future__ import annotations

import pytest

from modules import shared
from modules.api.errors import APIError
from modules.web_search import safe_get
from fixtures import api_helpers
from tests.image_server import ImageServer

PNG = api_helpers.image_bytes("red", "circle")


@pytest.fixture(scope="module")
def image_server():
    server = ImageServer(PNG).start()
    yield server
    server.stop()


@pytest.fixture
def command_line(monkeypatch):
    """Sets `shared.args` as `server.py ARGV` would, for one test."""
    def parse(*argv: str) -> None:
        monkeypatch.setattr(shared, "args", shared.parse_args(list(argv)))
    return parse


def native_fetch(url: str) -> bytes:
    from extensions.multimodal.tgw.native_media import fetch  # the extension's code, as it runs in text-generation-webui
    return fetch(url)


def test_loopback_is_refused_by_default(image_server, command_line):
    command_line()
    before = len(image_server.requests)
    with pytest.raises(APIError, match="request forgery guard") as raised:
        safe_get(image_server.url("/image.png"))
    assert "--api-allow-private-urls" in raised.value.message
    assert len(image_server.requests) == before, "refused before connecting"


def test_the_api_setting_allows_private_addresses(image_server, command_line):
    command_line("--api-allow-private-urls")
    response = safe_get(image_server.url("/image.png"))
    assert response.status_code == 200 and response.content == PNG
    response.raise_for_status()
    missing = safe_get(image_server.url("/missing.png"))
    assert missing.status_code == 404 and missing.text == "not found"
    with pytest.raises(APIError, match="HTTP 404"):
        missing.raise_for_status()


def test_the_extension_fetches_through_the_guard(image_server, command_line):
    from extensions.multimodal.core.image_codec import ImageDecodeError

    command_line()
    before = len(image_server.requests)
    with pytest.raises(ImageDecodeError, match="request forgery guard.*--api-allow-private-urls"):
        native_fetch(image_server.url("/image.png"))
    assert len(image_server.requests) == before
    command_line("--api-allow-private-urls")
    assert native_fetch(image_server.url("/image.png")) == PNG


def test_the_sync_entry_checks_redirects_and_keeps_its_limits(image_server, command_line):
    command_line("--api-allow-private-urls")
    hop = image_server.url("/image.png")
    for _ in range(2):
        hop = image_server.url(f"/redirect?to={hop}")
    assert safe_get(hop).content == PNG
    with pytest.raises(APIError, match="more than 1 times"):
        safe_get(hop, max_redirects=1)
    with pytest.raises(APIError, match="unsupported scheme 'file'"):
        safe_get(image_server.url("/redirect?to=file:///etc/passwd"))
    with pytest.raises(APIError, match="longer than 0.5 s"):
        safe_get(image_server.url("/slow"), timeout=0.5)
