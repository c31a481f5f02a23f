"""The shared corpus of bad pictures (fixtures/bad_pictures.py) through this host's API: each gets
HTTP 400 with a message naming the picture and the cause, and the next valid request is answered.
text-generation-webui's real server gets the same corpus from tools/tgw_bad_pictures.py."""
from __future__ import annotations

import pytest

from fixtures import api_helpers, bad_pictures, host_helpers

HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def api(llava_dir):
    saved = host_helpers.snapshot()
    host_helpers.load(llava_dir, ["multimodal"])
    live = api_helpers.start_api()
    yield live
    live.stop()
    host_helpers.restore(saved)


@pytest.mark.parametrize("case", bad_pictures.cases(), ids=lambda case: case.name)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_bad_picture_is_400_with_its_cause(api, case, stream):
    response = api.post("/chat/completions", json={**bad_pictures.request_body(case), "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert bad_pictures.names_the_cause(error["message"], case), error["message"]
    assert api.post("/chat/completions", json=HELLO).status_code == 200
