"""Command line, settings files and server start-up wiring."""
from __future__ import annotations

import subprocess
import sys

import pytest

from modules import extensions, shared
from tests.conftest import ROOT


def test_args_exist_without_reading_argv():
    assert shared.args.listen_port == 7860 and shared.args.api_port == 5000
    assert shared.args.model_dir == "models/" and shared.args.extensions == []


def test_flags_parse_with_text_generation_webui_names():
    args = shared.parse_args(["--model", "m", "--listen", "--listen-port", "9000", "--api", "--api-port", "5123",
                              "--nowebui", "--cpu", "--bf16", "--load-in-4bit", "--trust-remote-code",
                              "--extensions", "a", "b", "--listen-host", "0.0.0.0", "--model-dir", "x"])
    assert (args.model, args.listen, args.listen_port, args.api, args.api_port) == ("m", True, 9000, True, 5123)
    assert args.nowebui and args.cpu and args.bf16 and args.load_in_4bit and args.trust_remote_code
    assert args.extensions == ["a", "b"] and args.listen_host == "0.0.0.0" and args.model_dir == "x"


def test_multimodal_pipeline_implies_the_extension():
    args = shared.parse_args(["--multimodal-pipeline", "llava-hf"])
    assert args.extensions == ["multimodal"] and args.multimodal_pipeline == "llava-hf"
    args = shared.parse_args(["--extensions", "multimodal", "--multimodal-pipeline", "llava-hf"])
    assert args.extensions == ["multimodal"]


def test_help_lists_the_flags():
    out = subprocess.run([sys.executable, "server.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    for flag in ["--model", "--model-dir", "--extensions", "--multimodal-pipeline", "--settings", "--listen",
                 "--listen-host", "--listen-port", "--api", "--api-port", "--nowebui", "--cpu", "--bf16",
                 "--load-in-8bit", "--load-in-4bit", "--trust-remote-code"]:
        assert flag in out


def test_settings_file_updates_settings_and_extension_params(host, tmp_path):
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("max_new_tokens: 77\nexample-display_name: Renamed\nmultimodal-vision_bits: 16\n")
    assert shared.load_settings(settings_file) == settings_file
    assert shared.settings["max_new_tokens"] == 77
    assert shared.settings["multimodal-vision_bits"] == 16
    shared.args = shared.parse_args(["--extensions", "example"])
    extensions.load_extensions()
    example = sys.modules["extensions.example.script"]
    assert example.params["display_name"] == "Renamed"


def test_multimodal_vision_bits_setting_lands_in_params(host):
    # apply_settings is what load_extensions runs before setup(): check it on the real module.
    shared.settings["multimodal-vision_bits"] = 16
    script = host.import_fresh("extensions.multimodal.script")
    extensions.apply_settings(script, "multimodal")
    assert script.params["vision_bits"] == 16


def test_a_settings_file_that_is_not_a_mapping_is_refused(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        shared.load_settings(bad)


def test_default_settings_hold_every_generation_parameter():
    for key in ["max_new_tokens", "truncation_length", "add_bos_token", "do_sample", "temperature", "top_p", "seed",
                "ban_eos_token", "skip_special_tokens", "custom_stopping_strings", "default_extensions", "model"]:
        assert key in shared.settings
    assert shared.settings["max_new_tokens"] == 512 and shared.settings["add_bos_token"] is True


def test_missing_model_folder_says_where_it_looked(host):
    from modules import models

    with pytest.raises(FileNotFoundError, match="models/README.md"):
        models.load_model("no-such-model")


def test_quantization_on_cpu_is_a_clear_error(host, llama_dir):
    from modules import models

    shared.args = shared.parse_args(["--load-in-8bit", "--cpu"])
    with pytest.raises(ValueError, match="CUDA"):
        models.load_model(str(llama_dir))
