"""What a picture costs, through the API: budgets, the image tokens in `usage`, and pictures left out.

Each family with a budget knob is served from its tiny checkpoint (fixtures/vlm_families.py) as a
user's folder; one server takes the same picture at several budgets, each request checked against
Hugging Face's `generate(**processor(...))` (`fixtures/hf_reference.py`) with the processor keyword
arguments the budget stands for, written out per checkpoint (`BUDGET_KWARGS`, not the extension's
`budget_kwargs`): the prompt length and the reply must be equal. The tiny processors read small
pictures (their own defaults are a few thousand pixels), so a pixel budget below that shows the count
falling where "low" (512x512) would change nothing.
"""
from __future__ import annotations

import pytest

from extensions.multimodal.core import dropped_pictures, image_budget
from modules import chat, shared
from fixtures import api_helpers
from tests.test_vlm_families_host import NEW_TOKENS, hf_generate, png

KNOB_FAMILIES = ["qwen2_5_vl", "idefics3", "internvl", "mistral3"]  # BUDGET_KWARGS below
SMALL = 1024  # pixels: below every tiny checkpoint's own reading of these pictures
# The processor keyword arguments each budget stands for on these checkpoints (README, "What a picture
# costs"; the tiny processors' settings are in fixtures/vlm_families.py). "default": none. "low" is 512x512
# pixels but never above the checkpoint's default, "high" 2048x2048 but never below it.
BUDGET_KWARGS = {
    # pixels per picture: `size` {shortest_edge, longest_edge}; default 1024..16384 pixels
    "qwen2_5_vl": {SMALL: {"size": {"shortest_edge": 1024, "longest_edge": 1024}},
                   "low": {"size": {"shortest_edge": 1024, "longest_edge": 16384}},
                   "high": {"size": {"shortest_edge": 1024, "longest_edge": 2048 * 2048}}},
    # image splitting: `size` {longest_edge} in whole 32-pixel tiles, at most 6 a side; default 64
    "idefics3": {SMALL: {"size": {"longest_edge": 32}}, "low": {"size": {"longest_edge": 64}},
                 "high": {"size": {"longest_edge": 6 * 32}}},
    # tiles per picture: `max_patches` of 32x32 pixels; default 4
    "internvl": {SMALL: {"max_patches": 1}, "low": {"max_patches": 4}, "high": {"max_patches": 2048 * 2048 // 1024}},
    # the longest edge, never above the vision tower's 64 pixels
    "mistral3": {SMALL: {"size": {"longest_edge": 32}}, "low": {"size": {"longest_edge": 64}},
                 "high": {"size": {"longest_edge": 64}}},
}


def ask(api, picture: bytes, budget) -> dict:
    content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(picture)}},
               {"type": "text", "text": "What is in the picture?"}]
    response = api.post("/chat/completions", json={"model": "any", "max_tokens": NEW_TOKENS, "temperature": 0,
                                                   "messages": [{"role": "user", "content": content}],
                                                   "image_budget": budget})
    assert response.status_code == 200, response.text
    return response.json()


def reference(picture: bytes, budget) -> tuple[int, str, int]:
    """Hugging Face's prompt length, reply and image-token count under the budget's processor kwargs."""
    kwargs = BUDGET_KWARGS.get(shared.model.config.model_type, {}).get(budget, {})
    ids, reply = hf_generate([("What is in the picture?", [picture], None)], images_kwargs=kwargs)
    return ids.shape[0], reply, int((ids == shared.model.config.image_token_id).sum())


@pytest.mark.parametrize("name", KNOB_FAMILIES)
def test_each_budget_gives_hugging_faces_tokens_under_the_same_kwargs(family_folder, name):
    picture = png(96, 64, seed=21)
    with api_helpers.serving(family_folder(name), ["multimodal"]) as api:
        image_tokens = {}
        for budget in ("default", SMALL, "high", "low", "default"):  # one server: no budget's rows leak into another's
            body = ask(api, picture, budget)
            prompt_tokens, reply, _ = reference(picture, budget)
            assert body["usage"]["prompt_tokens"] == prompt_tokens, budget
            assert body["choices"][0]["message"]["content"] == reply, budget
            image_tokens[budget] = body["usage"]["prompt_tokens_details"]["image_tokens"]
    assert image_tokens["high"] >= image_tokens["default"] >= image_tokens["low"]
    assert image_tokens[SMALL] < image_tokens["default"], "the budget did not change the picture's cost"


def test_usage_counts_the_image_tokens_the_model_received(family_folder):
    """Qwen2.5-VL writes one `<|image_pad|>` per image token, and nothing else, for a picture."""
    picture = png(96, 64, seed=22)
    with api_helpers.serving(family_folder("qwen2_5_vl"), ["multimodal"]) as api:
        body = ask(api, picture, "default")
        _, _, expected = reference(picture, "default")
    assert body["usage"]["prompt_tokens_details"] == {"image_tokens": expected} and expected > 0


@pytest.mark.parametrize("name", ["llava_next", "gemma3"])
def test_a_fixed_family_reads_every_picture_the_same_way(family_folder, name):
    picture = png(96, 64, seed=23)
    with api_helpers.serving(family_folder(name), ["multimodal"]) as api:
        counts = {budget: ask(api, picture, budget)["usage"]["prompt_tokens_details"]["image_tokens"]
                  for budget in ("default", "low", "high", SMALL)}
    assert len(set(counts.values())) == 1, counts


def test_an_unknown_budget_is_refused_with_what_is_accepted(llava_dir):
    with api_helpers.serving(llava_dir, ["multimodal"]) as api:
        content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(png(32, 32, seed=24))}}]
        response = api.post("/chat/completions", json={"model": "any", "max_tokens": 2, "image_budget": "huge",
                                                       "messages": [{"role": "user", "content": content}]})
        assert response.status_code == 400 and "'default', 'low', 'high'" in response.json()["error"]["message"]
        assert ask(api, png(32, 32, seed=24), "low")["choices"], "the server keeps serving"


def three_picture_turns(api, truncation_length: int | None) -> dict:
    """Three user turns with a picture each (replies in between), as one request."""
    messages = []
    for turn in range(3):
        picture = api_helpers.data_url(png(48, 32, seed=30 + turn))
        messages.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture}},
                                                     {"type": "text", "text": f"Picture {turn + 1}?"}]})
        if turn < 2:
            messages.append({"role": "assistant", "content": f"Reply {turn + 1}."})
    body = {"model": "any", "max_tokens": 4, "temperature": 0, "messages": messages}
    if truncation_length is not None:
        body["truncation_length"] = truncation_length
    response = api.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_dropped_picture_is_named_by_its_turn(llava_dir):
    with api_helpers.serving(llava_dir, ["multimodal"]) as api:
        whole = three_picture_turns(api, None)
        assert "dropped_images" not in whole and "warnings" not in whole
        per_picture = whole["usage"]["prompt_tokens_details"]["image_tokens"] // 3
        # Room for everything but one picture: the oldest goes, with the text before it.
        cut = three_picture_turns(api, 4 + whole["usage"]["prompt_tokens"] - per_picture)
    assert cut["dropped_images"] == [{"turn": 1, "image": 1}]
    assert any("left out to fit the context" in warning and "the picture from turn 1" in warning
               for warning in cut["warnings"])
    assert cut["usage"]["prompt_tokens_details"]["image_tokens"] == 2 * per_picture


def test_a_picture_sent_again_and_dropped_is_named_by_the_turn_that_sent_it_last(llava_dir):
    """Three turns with a picture each, then a fourth that sends all three again, in a context with room
    for two of them: the host leaves out the three turns whole, and the extension the fourth's first
    picture. That picture is named by turn 4, not by turn 1, which held the same picture but was not
    in the prompt any more."""
    pictures = [api_helpers.data_url(png(48, 32, seed=50 + k)) for k in range(3)]
    again = [{"type": "image_url", "image_url": {"url": url}} for url in pictures] + [{"type": "text", "text": "All?"}]
    messages = []
    for turn, url in enumerate(pictures):
        messages += [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": f"Picture {turn + 1}?"}]},
                     {"role": "assistant", "content": f"Reply {turn + 1}."}]
    body = {"model": "any", "max_tokens": 4, "temperature": 0}
    with api_helpers.serving(llava_dir, ["multimodal"]) as api:
        alone = api.post("/chat/completions", json=body | {"messages": [{"role": "user", "content": again}]}).json()
        per_picture = alone["usage"]["prompt_tokens_details"]["image_tokens"] // 3
        cut = api.post("/chat/completions", json=body | {
            "messages": messages + [{"role": "user", "content": again}],
            "truncation_length": 4 + alone["usage"]["prompt_tokens"] - per_picture}).json()
    assert cut["dropped_turns"] == 3
    assert cut["dropped_images"] == [{"turn": 1, "image": 1}, {"turn": 2, "image": 1}, {"turn": 3, "image": 1},
                                     {"turn": 4, "image": 1}]
    assert any("the picture from turn 4 was left out" in warning for warning in cut["warnings"]), cut["warnings"]
    assert cut["usage"]["prompt_tokens_details"]["image_tokens"] == 2 * per_picture


def test_the_extension_reads_the_hosts_count_of_turns_left_out():
    assert dropped_pictures.HOST_DROPPED_TURNS == chat.DROPPED_TURNS


def test_the_budget_levels_and_their_errors():
    assert image_budget.parse(None) == image_budget.parse("default") == image_budget.DEFAULT
    assert image_budget.parse("low").pixels == 512 * 512 and image_budget.parse("low").at_most_default
    assert image_budget.parse("high").at_least_default
    assert image_budget.parse("300000") == image_budget.parse(300000) == image_budget.Budget("300000", 300000)
    for bad in ("huge", -5, 10, True, 1.5):
        with pytest.raises(ValueError, match="image_budget must be"):
            image_budget.parse(bad)



def test_a_picture_dropped_inside_the_new_message_is_named_by_its_place(llava_dir):
    """The extension's own truncation (whole pictures, oldest first) inside one message."""
    content = [{"type": "image_url", "image_url": {"url": api_helpers.data_url(png(48, 32, seed=40 + k))}}
               for k in range(3)] + [{"type": "text", "text": "Which is red?"}]
    body = {"model": "any", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": content}]}
    with api_helpers.serving(llava_dir, ["multimodal"]) as api:
        whole = api.post("/chat/completions", json=body).json()
        per_picture = whole["usage"]["prompt_tokens_details"]["image_tokens"] // 3
        cut = api.post("/chat/completions", json=body | {"truncation_length": 4 + whole["usage"]["prompt_tokens"]
                                                           - per_picture}).json()
    assert cut["dropped_images"] == [{"turn": 1, "image": 1}]
    assert any("the picture from turn 1 was left out" in warning for warning in cut["warnings"])
