"""Every error the API answers with leaves exactly one line in the server log, whether the request was
refused before any generation (a malformed message, an unknown route, a broken data URL, a wrong
parameter) or by the turn itself (a picture sent to a model that takes none), streamed or not: an
operator must be able to see what clients were told."""
from __future__ import annotations

import logging

import pytest

PNG_HEADER_ONLY = "data:image/png;base64,iVBORw0KGgo="


def picture_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is it?"}]}]


REFUSED = [
    ("/chat/completions", {"messages": [{"role": "robot", "content": "Hi"}]}, 400, "unsupported role 'robot'"),
    ("/chat/completions", {"messages": picture_message("data:image/png;base64,!!!")}, 400, "cannot be decoded"),
    ("/completions", {"prompt": "Hi", "max_tokens": "many"}, 422, "max_tokens"),
    ("/nowhere", {}, 404, "Unknown route POST /v1/nowhere"),
    ("/chat/completions", {"messages": picture_message(PNG_HEADER_ONLY)}, 400, "cannot take images"),
    ("/chat/completions", {"messages": picture_message(PNG_HEADER_ONLY), "stream": True}, 400, "cannot take images"),
]


@pytest.mark.parametrize("path, body, status, said", REFUSED, ids=[f"{s}-{said}" for _, _, s, said in REFUSED])
def test_each_refusal_is_logged_once(llama_api, caplog, path, body, status, said):
    with caplog.at_level(logging.WARNING, logger="text-generation-webui"):
        response = llama_api.post(path, json=body)
    assert response.status_code == status and said in response.json()["error"]["message"], response.text
    lines = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(lines) == 1, lines
