"""Per-model settings from `models/config.yaml` / `config-user.yaml` (text-generation-webui's format)."""
from __future__ import annotations

import pytest

from modules import model_settings, shared
from tests.conftest import ROOT


@pytest.fixture
def model_dir(host, tmp_path):
    shared.args = shared.parse_args(["--model-dir", str(tmp_path)])
    (tmp_path / "config.yaml").write_text(".*llava:\n  multimodal-add_all_images_to_prompt: true\n  top_p: 0.5\n"
                                          "other-model:\n  top_p: 0.1\n")
    return tmp_path


def test_matching_patterns_apply_and_user_files_override_shipped_ones(model_dir):
    (model_dir / "config-user.yaml").write_text(".*llava:\n  top_p: 0.7\n")
    assert model_settings.apply("My-LLaVA-7B") == {"multimodal-add_all_images_to_prompt": True, "top_p": 0.7}
    assert shared.settings["top_p"] == 0.7 and shared.settings["multimodal-add_all_images_to_prompt"] is True


def test_the_users_settings_file_wins(model_dir, tmp_path_factory):
    user = tmp_path_factory.mktemp("user") / "settings.yaml"
    user.write_text("top_p: 0.95\n")
    shared.load_settings(user)
    model_settings.apply("my-llava")
    assert shared.settings["top_p"] == 0.95
    assert shared.settings["multimodal-add_all_images_to_prompt"] is True


def test_loading_another_model_takes_the_previous_settings_back(model_dir):
    before = shared.settings["top_p"]
    model_settings.apply("my-llava")
    model_settings.apply("other-model")
    assert shared.settings["top_p"] == 0.1
    assert "multimodal-add_all_images_to_prompt" not in shared.settings
    model_settings.apply("plain-llama")
    assert shared.settings["top_p"] == before


def test_a_malformed_file_names_itself(model_dir):
    (model_dir / "config-user.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="config-user.yaml"):
        model_settings.settings_for("x")


def test_the_shipped_config_turns_add_all_images_on_for_the_demo_only(host):
    shared.args = shared.parse_args([])
    assert (ROOT / "models" / "config.yaml").exists()
    assert model_settings.settings_for(shared.DEMO_MODEL) == {"multimodal-add_all_images_to_prompt": True}
    assert model_settings.settings_for("llava-1.5-7b-hf") == {}


def test_the_models_context_is_the_truncation_length_unless_the_users_settings_file_sets_one(host, tmp_path):
    from modules import models

    shared.args = shared.parse_args([])
    shared.settings["truncation_length"] = 999
    models.load_model(shared.DEMO_MODEL)
    assert shared.settings["truncation_length"] == 2048  # the demo's max_position_embeddings
    user = tmp_path / "settings.yaml"
    user.write_text("truncation_length: 256\n")
    shared.load_settings(user)
    models.load_model(shared.DEMO_MODEL)
    assert shared.settings["truncation_length"] == 256
