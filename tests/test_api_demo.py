"""The shipped demo model behind the API: 16 concurrent requests, each with its own picture, get 16
answers that each name their own picture's shape and colour (no request lost, no answer swapped).

Skipped only while `models/tiny-llava-shapes/` has not been trained yet (tools/train_demo_model.py).
"""
from __future__ import annotations

import io
import random
import threading

import pytest

from modules import shared
from tests import api_helpers, host_helpers
from tests.conftest import ROOT

DEMO_DIR = ROOT / "models" / shared.DEMO_MODEL
pytestmark = pytest.mark.skipif(not (DEMO_DIR / "config.json").exists(),
                                reason=f"{DEMO_DIR} is absent: run python tools/train_demo_model.py")


@pytest.fixture(scope="module")
def demo_api():
    saved = host_helpers.snapshot()
    host_helpers.load(DEMO_DIR, ["multimodal"])
    api = api_helpers.start_api()
    yield api
    api.stop()
    host_helpers.restore(saved)


def sixteen_pictures(seed: int) -> list[tuple[str, str, bytes]]:
    from tools.train_demo_model import COLOURS, SHAPES, render_shape

    rng = random.Random(seed)
    jobs = rng.sample([(c, s) for c in COLOURS for s in SHAPES], 16)
    pictures = []
    for colour, shape in jobs:
        buffer = io.BytesIO()
        render_shape(colour, shape, rng).save(buffer, format="PNG")
        pictures.append((colour, shape, buffer.getvalue()))
    return pictures


def test_sixteen_concurrent_requests_name_their_own_picture(demo_api):
    from tools.train_demo_model import COLOURS, SHAPES, answer_for

    pictures = sixteen_pictures(seed=20240607)
    replies: dict[int, str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(pictures))

    def ask(i: int) -> None:
        _, _, data = pictures[i]
        content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(data)}},
                   {"type": "text", "text": "What is in this picture?"}]
        try:
            start.wait()
            result = demo_api.client().chat.completions.create(
                model=shared.model_name, messages=[{"role": "user", "content": content}], temperature=0,
                max_tokens=24)
            replies[i] = result.choices[0].message.content
        except BaseException as error:  # reported below, with the others
            errors.append(error)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(pictures))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(replies) == 16, "every request got an answer"
    for i, (colour, shape, _) in enumerate(pictures):
        words = replies[i].lower().rstrip(".").split()
        assert colour in words and shape in words, f"request {i} ({colour} {shape}) got {replies[i]!r}"
        assert not (set(words) & (set(COLOURS) - {colour})) and not (set(words) & (set(SHAPES) - {shape}))
    exact = sum(replies[i].strip() == answer_for(c, s) for i, (c, s, _) in enumerate(pictures))
    assert exact == 16, replies
