"""End to end through host + multimodal extension vs Hugging Face's own `generate` (llava-hf).

Our prompt carries `<img src="data:image/png;base64,...">` tags where HF's has `<image>`; HF's
processor gets the images decoded back from those very tags: both sides see the same pixels. No `--multimodal-pipeline` is given: the pipeline is picked from the loaded model.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from extensions.multimodal.core.image_codec import IMAGE_TAG_RE, store_image, tag_b64_to_image
from modules import shared
from modules.extensions import apply_extensions
from modules.text_generation import decode, encode, generate_reply
from fixtures import host_helpers
from tests.test_llava_hf import random_image

ONE = "USER: {0}\nWhat is this?\nASSISTANT:"
TWO = "USER: {0}\nWhat is this? And {1} this?\nASSISTANT:"


@pytest.fixture(scope="module")
def folders(llava_dir, llava_next_dir):
    return {"llava": llava_dir, "llava_next": llava_next_dir}


def served(host, folder):
    # add_all_images_to_prompt: every image gets real embeddings, as in HF's forward
    host.load(folder, ["multimodal"], settings={"multimodal-add_all_images_to_prompt": True})
    script = importlib.import_module("extensions.multimodal.script")
    assert script.served_model.current_embedder() is not None, "the multimodal extension did not set up (see the log)"
    assert script.served_model.current_embedder().pipeline.name() == "llava-hf"
    return script


def tagged(sizes):
    """(tags, the images decoded back from them)."""
    tags = [store_image(random_image(w, h, seed)).tag for seed, (w, h) in enumerate(sizes)]
    return tags, [tag_b64_to_image(IMAGE_TAG_RE.search(tag).group("data")) for tag in tags]


CASES = [("llava", [(32, 32)]), ("llava", [(48, 40), (24, 56)]),
         ("llava_next", [(40, 20)]), ("llava_next", [(40, 20), (20, 64)])]


@pytest.mark.parametrize("kind, sizes", CASES)
def test_greedy_tokens_and_first_logits_equal_hf(host, folders, kind, sizes):
    served(host, folders[kind])
    tags, images = tagged(sizes)
    template = ONE if len(sizes) == 1 else TWO
    prompt = template.format(*tags)
    inputs = host_helpers.hf_processor()(text=template.format(*["<image>"] * len(sizes)), images=images, return_tensors="pt")

    state = host.greedy_state(max_new_tokens=10, ban_eos_token=True)
    _, ids, embeds = apply_extensions("tokenizer", state, prompt, encode(prompt), None)
    assert torch.equal(ids.cpu(), inputs["input_ids"]), "same token ids, image tokens included"
    with torch.no_grad():
        ours = shared.model(inputs_embeds=embeds).logits[0, -1]
        theirs = shared.model(**inputs).logits[0, -1]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)

    reply = list(generate_reply(prompt, state))[-1]
    eos, pad = shared.tokenizer.eos_token_id, shared.tokenizer.pad_token_id
    with torch.no_grad():
        out = shared.model.generate(**inputs, max_new_tokens=10, do_sample=False, suppress_tokens=[eos], pad_token_id=pad)
    new_ids = out[0, inputs["input_ids"].shape[1]:]
    assert reply == decode(new_ids)
    assert state["generation_stats"]["completion_tokens"] == len(new_ids) == 10
    assert state["generation_stats"]["prompt_tokens"] == inputs["input_ids"].shape[1]


def test_server_main_with_a_llava_hf_folder_and_no_pipeline_flag(host, folders):
    import server

    server.main(["--model", str(folders["llava_next"]), "--nowebui"])  # loads, then returns: nothing to serve
    script = importlib.import_module("extensions.multimodal.script")
    assert "multimodal" in shared.args.extensions and shared.args.multimodal_pipeline is None
    assert script.served_model.current_embedder().pipeline.name() == "llava-hf"
    tags, _ = tagged([(40, 20)])
    reply = list(generate_reply(ONE.format(tags[0]), host.greedy_state(max_new_tokens=4, ban_eos_token=True)))[-1]
    assert reply
