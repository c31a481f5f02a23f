"""The extension's engine for text-generation-webui, without text-generation-webui: its two copies of the
wire format agree, its model folder loads without weights, launch.py takes its flags, and samplers vLLM
lacks are refused.

Inside text-generation-webui the extension cannot import this host's `modules/`, so it speaks vLLM's
chat format itself (extensions/multimodal/tgw/engine_client.py) beside the host's
(modules/openai_engine.py). These tests keep the two one format: the same request body, template, error
messages and safe URLs for the same inputs. The engine itself, in both text-generation-webui versions
against a real vLLM, is tools/tgw_engine_check.py's (run by tools/check_in_tgw.sh).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from extensions.multimodal.tgw import engine_client, engine_model, remote_generation
from modules import engine as host_engine
from modules import openai_engine, shared

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "tiny-llava-shapes"
PICTURE = "data:image/png;base64,iVBORw0KGgo="

REQUESTS = [  # (pieces, images, placeholder, add_special_tokens, sampling, processor_kwargs)
    (["USER: ", "\nWhat is it? ASSISTANT:"], [PICTURE], "<image>", False, {"max_tokens": 8, "temperature": 0.0}, {}),
    (["", " and ", ""], [PICTURE, PICTURE], "<|image_pad|>", True,
     {"max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "seed": 3, "logit_bias": {"2": -100}},
     {"max_pixels": 200704}),
    (["Hello"], [], "", True, {"max_tokens": 1, "temperature": 0}, {}),
]


@pytest.mark.parametrize("request_fields", REQUESTS)
def test_both_copies_send_the_same_request(request_fields):
    pieces, images, placeholder, add_special, sampling, processor_kwargs = request_fields
    host = openai_engine.OpenAIChatEngine("http://127.0.0.1:9/v1")
    host.model = "served"
    hosts = host.body(host_engine.EngineRequest(pieces, images, placeholder, add_special, sampling, processor_kwargs))
    extensions = engine_client.request_body("served", pieces, images, placeholder, add_special, sampling,
                                            processor_kwargs)
    assert extensions == hosts
    assert engine_client.parts_template(placeholder) == openai_engine.parts_template(placeholder)


@pytest.mark.parametrize("body", [{"error": {"message": "At most 4 image(s) may be provided in one prompt."}},
                                  {"message": "older vLLM"}, {"error": "plain"}, ["odd"], "text"])
def test_both_copies_read_vllms_errors_alike(body):
    assert engine_client.error_message(body) == openai_engine.error_message(body)


@pytest.mark.parametrize("entry, context", [({"id": "m", "max_model_len": 2048}, 2048), ({"id": "m"}, None),
                                            ({"max_model_len": None}, None), ({"max_model_len": "2048"}, None),
                                            ({"max_model_len": 0}, None), ({"max_model_len": True}, None)])
def test_both_copies_read_the_served_context_alike(entry, context):
    assert engine_client.context_length(entry) == openai_engine.context_length(entry) == context


@pytest.mark.parametrize("url", ["http://user:pw@gpu:8000/v1", "http://gpu/v1", "https://k@h/v1"])
def test_both_copies_hide_credentials_alike(url):
    assert engine_client.safe_url(url) == host_engine.safe_url(url)
    assert "pw" not in engine_client.safe_url(url)


def test_the_folder_loads_without_weights_and_generates_through_the_engine():
    from transformers import AutoModelForImageTextToText

    model = engine_model.without_weights(AutoModelForImageTextToText, DEMO)
    on_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    embedding = model.get_input_embeddings().weight
    assert on_meta and embedding.device.type == "cpu" and embedding.untyped_storage().nbytes() <= 4
    assert type(model).__name__ == "LlavaForConditionalGeneration" and model.device == torch.device("cpu")
    assert model.to("cuda") is model and model.cuda() is model  # nothing to move: no GPU is touched
    with pytest.raises(RuntimeError, match="did not send"):  # the engine's generate(), with no reply opened
        model.generate(inputs=torch.tensor([[1, 2]]))
    with pytest.raises(RuntimeError, match="weights are in the remote engine"):  # not "Cannot copy out of meta"
        model(input_ids=torch.tensor([[1, 2]]))


def test_launch_takes_the_engine_flags_off_the_command_line(monkeypatch):
    spec = importlib.util.spec_from_file_location("launch_under_test", ROOT / "extensions" / "multimodal" / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    # setenv records what to restore: the flags' values must not outlive this test (every later test
    # would then send its replies to an engine)
    monkeypatch.setenv("MULTIMODAL_ENGINE_URL", "")
    monkeypatch.setenv("MULTIMODAL_ENGINE_API_KEY", "")
    rest = launch.take_engine_flags(["--model", "m", "--multimodal-engine-url", "http://gpu:8000/v1",
                                     "--multimodal-engine-api-key=k", "--api"])
    assert rest == ["--model", "m", "--api"]
    assert os.environ["MULTIMODAL_ENGINE_URL"] == "http://gpu:8000/v1" and os.environ["MULTIMODAL_ENGINE_API_KEY"] == "k"
    with pytest.raises(SystemExit, match="needs a value"):
        launch.take_engine_flags(["--multimodal-engine-url"])


def test_the_setting_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("MULTIMODAL_ENGINE_URL", "http://from-launch/v1")
    assert engine_client.engine_url({"engine_url": ""}) == "http://from-launch/v1"
    assert engine_client.engine_url({"engine_url": "http://setting/v1"}) == "http://setting/v1"
    monkeypatch.delenv("MULTIMODAL_ENGINE_URL")
    assert engine_client.engine_url({}) == ""


@pytest.mark.parametrize("sampler, value", [("mirostat_mode", 2), ("dry_multiplier", 0.8), ("typical_p", 0.9),
                                            ("grammar_string", "root ::= \"a\""), ("presence_penalty", 0.5),
                                            ("frequency_penalty", 0.3)])
def test_samplers_vllm_lacks_are_refused_not_ignored(sampler, value):
    remote_generation.refuse_unsupported({"mirostat_mode": 0, "typical_p": 1})  # neutral: fine
    with pytest.raises(engine_client.EngineRefusedError, match=sampler):
        remote_generation.refuse_unsupported({sampler: value})


class Stream:
    closed = False

    def close(self):
        self.closed = True


@pytest.mark.parametrize("penalty, window, refused", [(1.1, 1024, True), (1.1, 0, False), (1.1, 2048, False),
                                                      (1.0, 16, False)])
def test_a_repetition_penalty_range_shorter_than_prompt_and_reply_is_refused(penalty, window, refused):
    """vLLM penalizes repeats across the whole prompt and reply (1000 + 100 tokens here)."""
    state, stream = {"repetition_penalty": penalty, "repetition_penalty_range": window, "max_new_tokens": 100}, Stream()
    if refused:
        with pytest.raises(engine_client.EngineRefusedError, match="repetition_penalty_range to 0"):
            remote_generation.refuse_short_penalty_range(state, 1000, stream)
    else:
        remote_generation.refuse_short_penalty_range(state, 1000, stream)
    assert stream.closed == refused  # vLLM aborts the request sent


def test_samplers_and_bans_under_vllms_names(monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setattr(shared, "tokenizer", AutoTokenizer.from_pretrained(DEMO))
    state = {"max_new_tokens": 12, "do_sample": False, "ban_eos_token": True, "custom_token_bans": "5, 7",
             "repetition_penalty": 1.1}
    fields = remote_generation.sampling(state, {})
    assert fields["temperature"] == 0.0 and fields["max_tokens"] == 12 and fields["repetition_penalty"] == 1.1
    assert "presence_penalty" not in fields and "frequency_penalty" not in fields  # refused unless neutral
    assert fields["logit_bias"] == {"2": -100, "5": -100, "7": -100}  # EOS (2) and the custom bans
    sampled = remote_generation.sampling({**state, "do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.9,
                                          "min_p": 0.05, "auto_max_new_tokens": True}, {})
    assert sampled["top_k"] == -1 and sampled["min_p"] == 0.05 and "max_tokens" not in sampled


def test_the_bos_is_text_generation_webuis(monkeypatch):
    """The host's `encode()`'s BOS, written in (here this host's `encode`, which follows text-generation-webui's
    rule; inside text-generation-webui its own: tools/tgw_engine_check.py compares the tokens with Hugging Face)."""
    from transformers import AutoTokenizer

    monkeypatch.setattr(shared, "tokenizer", AutoTokenizer.from_pretrained(DEMO))
    assert remote_generation.with_hosts_bos("USER: hi", {"add_bos_token": True}) == "<s>USER: hi"
    assert remote_generation.with_hosts_bos("<s><s>USER: hi", {"add_bos_token": True}) == "<s>USER: hi"
    # add_bos_token off: this tokenizer adds its BOS itself, and encode() keeps it (as text-generation-webui's)
    assert remote_generation.with_hosts_bos("USER: hi", {"add_bos_token": False}) == "<s>USER: hi"


def test_this_hosts_extension_leaves_text_generation_webuis_engine_alone(monkeypatch):
    """This host has its own --engine-url: the extension's engine setting, or its variable left in the
    environment, must not send this host's replies anywhere."""
    import extensions.multimodal.script as script

    monkeypatch.setenv("MULTIMODAL_ENGINE_URL", "http://gpu:8000/v1")
    assert engine_client.engine_url(script.params) == "http://gpu:8000/v1"
    assert not script.tgw_engine_set()
