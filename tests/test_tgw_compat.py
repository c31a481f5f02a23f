"""What the extension needs to run in text-generation-webui too, checked in this repository's host.

The real proof is `tools/check_in_tgw.sh` (the extension inside both text-generation-webui versions,
run by .ci/run); these tests pin the pieces here, where they fail fast:
- the extension imports only names every host has (anything else inside a feature check);
- the pipeline comes from the `multimodal-pipeline` setting where a host has no --multimodal-pipeline;
- today's `<__media__>` markers take the pictures the state carries, matched from the newest;
- image rows never carry the pad id, so `generate()` without an attention mask still sees them.
"""
from __future__ import annotations

import ast
import base64
import io
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from modules import shared
from tests.conftest import ROOT
from tests.multimodal_fake_pipeline import noise_image, tag
from tests.test_multimodal_host import load_multimodal

EXTENSION = ROOT / "extensions" / "multimodal"
# What text-generation-webui (598568b1 and 1dcde41d) and this host all have.
SHARED_NAMES = {"modules": {"shared"},
                "modules.text_generation": {"encode", "get_max_prompt_length", "generate_reply_HF"},
                "modules.logging_colors": {"logger"}, "modules.extensions": None}
# Host-specific modules the extension may use only inside `try: ... except ImportError`.
FEATURE_DETECTED = {"modules.logits_processors", "modules.web_search"}


def imports(path: Path, package: str):
    """(module, names, inside a try that catches ImportError) for every import of `package.*` in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = {id(node) for handler in ast.walk(tree) if isinstance(handler, ast.Try)
               if any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in handler.handlers)
               for statement in handler.body for node in ast.walk(statement)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            yield node.module, {alias.name for alias in node.names}, id(node) in guarded
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(package):
                    yield alias.name, set(), id(node) in guarded


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_the_extension_imports_only_what_every_host_has():
    files = sorted(EXTENSION.rglob("*.py"))
    assert len(files) > 10
    # A module that needs a host-specific one is itself imported only where its ImportError is caught.
    only_guarded = {module for path in files for module, _, guarded in imports(path, "extensions.multimodal")}
    only_guarded -= {module for path in files for module, _, guarded in imports(path, "extensions.multimodal")
                     if not guarded}
    for path in files:
        for module, names, guarded in imports(path, "modules"):
            if module in FEATURE_DETECTED:
                assert guarded or module_name(path) in only_guarded, \
                    f"{path}: {module} exists only in some hosts: import it inside try/except ImportError"
                continue
            assert module in SHARED_NAMES, f"{path}: imports {module}, which text-generation-webui does not have"
            allowed = SHARED_NAMES[module]
            assert allowed is None or names <= allowed, f"{path}: {module}.{names - allowed} is not in every host"


def test_a_host_without_the_flag_takes_the_pipeline_from_the_setting(host, llama_dir):
    def without_flag():
        del shared.args.multimodal_pipeline  # today's text-generation-webui has no such argument

    host.load(llama_dir, argv=[], settings={"multimodal-pipeline_dirs": [str(ROOT / "tests" / "multimodal_pipelines")],
                                            "multimodal-pipeline": "fake-big"})
    without_flag()
    from extensions.multimodal import script
    from modules import extensions

    extensions.apply_settings(script, "multimodal")
    script.setup()
    assert script.served_model.embedder(script.params).pipeline.name() == "fake-big"

    script.params["pipeline"] = None
    with pytest.raises(RuntimeError) as error:
        script.setup()
    message = str(error.value)
    assert "multimodal-pipeline: NAME" in message and "no --multimodal-pipeline flag" in message and "fake-big" in message


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def media_state(**extra) -> dict:
    return {"add_bos_token": True, "truncation_length": 1024, "max_new_tokens": 8, **extra}


def test_media_markers_take_the_state_pictures_matched_from_the_newest(host, llama_dir):
    script = load_multimodal(host, llama_dir, add_all_images_to_prompt=True)
    pictures = [noise_image(seed, (24, 24)) for seed in (1, 2, 3)]
    prompt = "USER: <__media__>\nfirst?\nASSISTANT: ok\nUSER: <__media__>\nsecond?\nASSISTANT:"
    # Two markers (an older turn was dropped to fit), three pictures: the markers take the last two.
    tags = [script.image_to_history_tag(picture) for picture in pictures[1:]]
    expected = script.tokenizer_modifier(media_state(), prompt.replace("<__media__>", "{}").format(*tags), None, None)[2]
    sources = {
        "chat box": {"image_attachments": [{"type": "image", "image_data": data_url(p)} for p in pictures]},
        "chat API": {"history": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": data_url(p)}}]}
            for p in pictures]}},
        "completions API": {"raw_images": pictures},
    }
    for source, extra in sources.items():
        _, ids, embeds = script.tokenizer_modifier(media_state(**extra), prompt, None, None)
        assert torch.equal(embeds, expected), source
    shifted = script.tokenizer_modifier(media_state(raw_images=pictures[:2]), prompt, None, None)[2]
    assert not torch.equal(shifted, expected), "other pictures give other embeddings"


def test_a_marker_without_a_picture_is_left_out_with_a_notice(host, llama_dir):
    script = load_multimodal(host, llama_dir)
    state = media_state(raw_images=[noise_image(5, (24, 24))])
    _, ids, _ = script.tokenizer_modifier(state, "USER: <__media__><__media__>\nWhat?\nASSISTANT:", None, None)
    assert ids.shape[1] == script.served_model.embedder(script.params).len_in_tokens(
        "USER: " + script.image_to_history_tag(noise_image(5, (24, 24))) + "\nWhat?\nASSISTANT:")
    assert any("1 <__media__> marker(s)" in notice for notice in state["notices"])


def test_a_marker_with_no_picture_at_all_leaves_the_prompt(host, llama_dir):
    """The host's ids held the marker's tokens; the prompt the hook returns has none, and its ids say so."""
    from modules.text_generation import encode

    script = load_multimodal(host, llama_dir)
    state = media_state()
    prompt, ids, embeds = script.tokenizer_modifier(state, "USER: <__media__>\nWhat?\nASSISTANT:",
                                                    encode("USER: <__media__>\nWhat?\nASSISTANT:"), None)
    assert prompt == "USER: \nWhat?\nASSISTANT:" and embeds is None
    assert torch.equal(ids, encode(prompt))
    assert any("1 <__media__> marker(s)" in notice for notice in state["notices"])


def test_completions_pictures_without_a_marker_go_before_the_prompt(host, llama_dir):
    """`/v1/completions` with image parts: text-generation-webui writes no marker (its ExLlamaV3 loader
    puts the pictures first); they are not dropped."""
    script = load_multimodal(host, llama_dir)
    pictures = [noise_image(seed, (24, 24)) for seed in (4, 5)]
    tags = "".join(script.image_to_history_tag(picture) + "\n" for picture in pictures)
    expected = script.tokenizer_modifier(media_state(), tags + "Describe them:", None, None)[2]
    _, _, embeds = script.tokenizer_modifier(media_state(raw_images=pictures), "Describe them:", None, None)
    assert embeds is not None and torch.equal(embeds, expected)


def test_image_rows_never_carry_the_pad_id(host, llama_dir):
    """text-generation-webui generates with no attention mask: transformers masks every pad-id position."""
    from extensions.multimodal.core.pad_safe_ids import image_row_id

    script = load_multimodal(host, llama_dir)
    placeholder = script.served_model.embedder(script.params).pipeline.placeholder_token_id()
    shared.model.generation_config.pad_token_id = placeholder  # LLaVA-1.5 on Vicuna: <unk> = 0 = pad
    prompt = "USER: " + tag(noise_image(7, (24, 24))) + "\nWhat is it?\nASSISTANT:"
    _, ids, embeds = script.tokenizer_modifier(media_state(), prompt, None, None)
    assert placeholder not in ids[0].tolist()

    def greedy(input_ids, **kwargs):
        return shared.model.generate(inputs=input_ids, inputs_embeds=embeds, max_new_tokens=8, do_sample=False,
                                     suppress_tokens=[shared.tokenizer.eos_token_id], **kwargs)[0].tolist()

    unmasked = greedy(ids, attention_mask=torch.ones_like(ids))
    assert greedy(ids) == unmasked, "generate() without a mask sees the image rows"
    placeholder_ids = torch.where(ids == image_row_id(script.served_model.embedder(script.params).pipeline), placeholder, ids)
    assert greedy(placeholder_ids) != unmasked, "with placeholder ids the rows would be masked (the original bug)"


def test_the_extension_loads_by_file_path_as_today_s_text_generation_webui_loads_user_extensions(tmp_path):
    """`user_data/extensions/multimodal/script.py`, imported as a loose module: its siblings still import."""
    import shutil
    import subprocess

    copy = tmp_path / "user_data" / "extensions" / "multimodal"
    shutil.copytree(EXTENSION, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("user_ext_multimodal", {str(copy / 'script.py')!r})
module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; spec.loader.exec_module(module)
from extensions.multimodal.core import image_codec
from extensions.multimodal import script
from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline  # what third-party pipelines import
assert script is module and image_codec.__file__.startswith({str(copy)!r}), image_codec.__file__
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_a_media_url_is_never_fetched_without_a_private_address_guard(host, llama_dir, monkeypatch):
    """`<__media__>` pictures given as http(s) URLs go through the host's guarded fetcher only
    (`modules.web_search.safe_get`); in a host without one (old text-generation-webui) the URL is
    refused. This host's fetcher itself: tests/test_one_fetcher.py."""
    from extensions.multimodal.core.image_codec import ImageDecodeError
    from extensions.multimodal.tgw.native_media import picture_data

    monkeypatch.setitem(sys.modules, "modules.web_search", None)  # the import fails, as in such a host
    with pytest.raises(ImageDecodeError, match="refuses private addresses"):
        picture_data("http://127.0.0.1:9/picture.png", "the picture")
