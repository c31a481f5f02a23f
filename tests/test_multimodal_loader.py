"""pipeline_loader: importing pipeline modules from folders (hyphens, no __init__.py), picking a pipeline."""
from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline
from extensions.multimodal.core import pipeline_loader
from extensions.multimodal.core.pipeline_loader import BUILTIN_PIPELINES_DIR, load_pipeline, pipeline_roots
from modules import shared

PIPELINE_CLASS = """
class Pipeline:
    def __init__(self, name, params):
        self._name, self.params = name, params

    def name(self):
        return self._name
"""


def write_module(root: Path, folder: str, source: str, **extra_files: str) -> Path:
    directory = root / folder
    directory.mkdir(parents=True)
    (directory / "pipelines.py").write_text(textwrap.dedent(source))
    for name, text in extra_files.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(text))
    return directory


@pytest.fixture
def pipeline_dirs(host, tmp_path):
    """`pipeline_dirs`: a folder of modules: a hyphenated one with relative imports, a broken one, one without auto-pick."""
    write_module(tmp_path, "my-pipes", """
        from .impl import Pipeline, NAMES
        available_pipelines = NAMES

        def get_pipeline(name, params):
            return Pipeline(name, params) if name in NAMES else None

        def get_pipeline_from_model_name(model_name, params):
            return Pipeline("alpha-7b", params) if "alpha" in model_name else None
        """, impl=PIPELINE_CLASS + "\nNAMES = ['alpha-7b', 'alpha-13b']\n")
    write_module(tmp_path, "broken", """
        available_pipelines = ['never-seen']
        raise ZeroDivisionError('a pipeline module that fails to import')
        """)
    write_module(tmp_path, "zz_no_auto", """
        from .impl import Pipeline
        available_pipelines = ['beta']

        def get_pipeline(name, params):
            return Pipeline(name, params) if name == 'beta' else None
        """, impl=PIPELINE_CLASS)
    (tmp_path / "not-a-module").mkdir()
    (tmp_path / "README.txt").write_text("ignored")
    return [str(tmp_path)]


def test_named_pipeline_from_a_hyphenated_folder_with_relative_imports(pipeline_dirs):
    shared.args.multimodal_pipeline = "alpha-13b"
    pipeline, module = load_pipeline({"vision_bits": 16, "pipeline_dirs": pipeline_dirs})
    assert pipeline.name() == "alpha-13b" and module == "my-pipes"
    assert pipeline.params == {"vision_bits": 16, "pipeline_dirs": pipeline_dirs}
    assert "extensions.multimodal.pipelines.my-pipes.pipelines" in sys.modules
    assert "extensions.multimodal.pipelines.my-pipes.impl" in sys.modules


def test_a_module_that_raises_on_import_is_logged_and_skipped(pipeline_dirs, caplog):
    shared.args.multimodal_pipeline = "beta"
    with caplog.at_level(logging.ERROR):
        pipeline, module = load_pipeline({"pipeline_dirs": pipeline_dirs})
    assert (pipeline.name(), module) == ("beta", "zz_no_auto")
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "broken" in logged and "ZeroDivisionError" in logged and "Traceback" in logged


def test_a_pipeline_that_does_not_subclass_the_contract_gets_its_defaults(pipeline_dirs):
    """Its class gains the contract's defaults for the methods it lacks; its own name and attributes stay."""
    shared.args.multimodal_pipeline = "beta"
    pipeline, _ = load_pipeline({"pipeline_dirs": pipeline_dirs})
    assert isinstance(pipeline, AbstractMultimodalPipeline)
    assert type(pipeline).__qualname__ == "Pipeline" and pipeline.params == {"pipeline_dirs": pipeline_dirs}
    assert (pipeline.cache_key(), pipeline.embeds_all_images(), pipeline.layout_depends_on_count(),
            pipeline.budget_knob(), pipeline.features_exact_here()) == ("beta", False, False, None, True)


def test_auto_pick_from_the_model_name_skips_modules_without_the_function(pipeline_dirs):
    shared.args.multimodal_pipeline = None
    shared.model_name = "Alpha-Chat-7B"
    pipeline, module = load_pipeline({"pipeline_dirs": pipeline_dirs})
    assert (pipeline.name(), module) == ("alpha-7b", "my-pipes")


def test_unknown_name_lists_every_available_pipeline(pipeline_dirs):
    shared.args.multimodal_pipeline = "gamma"
    with pytest.raises(RuntimeError) as error:
        load_pipeline({"pipeline_dirs": pipeline_dirs})
    message = str(error.value)
    assert "'gamma' not found" in message
    assert all(name in message for name in ("alpha-7b", "alpha-13b", "beta"))


def test_no_name_and_an_unrecognised_model_says_why_not_attribute_error(pipeline_dirs):
    shared.args.multimodal_pipeline = None
    shared.model_name = "some-text-model"
    with pytest.raises(RuntimeError) as error:
        load_pipeline({"pipeline_dirs": pipeline_dirs})
    message = str(error.value)
    assert "some-text-model" in message and "--multimodal-pipeline" in message and "beta" in message


def test_no_modules_at_all(host, tmp_path, monkeypatch):
    """No module anywhere: the built-in folder stands empty (moved, as in a broken install)."""
    monkeypatch.setattr(pipeline_loader, "BUILTIN_PIPELINES_DIR", tmp_path)
    shared.args.multimodal_pipeline = "anything"
    with pytest.raises(RuntimeError, match="No pipelines are available"):
        load_pipeline({})


def test_same_folder_name_in_another_place_is_loaded_from_that_place(host, tmp_path):
    for index in (1, 2):
        write_module(tmp_path / str(index), "same-name", f"""
            from .impl import Pipeline
            available_pipelines = ['p{index}']
            def get_pipeline(name, params):
                return Pipeline(name, params) if name == 'p{index}' else None
            """, impl=PIPELINE_CLASS)
        shared.args.multimodal_pipeline = f"p{index}"
        assert load_pipeline({"pipeline_dirs": [tmp_path / str(index)]})[0].name() == f"p{index}"


def test_roots_are_the_builtin_folder_then_the_param():
    assert BUILTIN_PIPELINES_DIR.name == "pipelines" and BUILTIN_PIPELINES_DIR.parent.name == "multimodal"
    assert (BUILTIN_PIPELINES_DIR / "place-additional-pipelines-here.txt").is_file()
    assert pipeline_roots({}) == [BUILTIN_PIPELINES_DIR]
    assert pipeline_roots({"pipeline_dirs": ["/x/y"]}) == [BUILTIN_PIPELINES_DIR, Path("/x/y")]
    assert pipeline_loader.PACKAGE == "extensions.multimodal.pipelines"


def test_a_pipeline_written_for_the_original_extension_builds_on_the_default_params(llama, tmp_path):
    """The original LLaVA pipelines read their settings with the base class's helpers in `__init__`;
    this extension's defaults are None there, which mean the language model's device and dtype."""
    from extensions.multimodal.core.defaults import DEFAULT_PARAMS

    write_module(tmp_path, "cloned-llava", """
        import torch
        from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline

        class Cloned(AbstractMultimodalPipeline):
            def __init__(self, params):
                self.clip_device = self._get_device("vision_device", params)
                self.clip_dtype = self._get_dtype("vision_bits", params)
                self.projector_dtype = self._get_dtype("projector_bits", params, self.clip_device)
            name = staticmethod(lambda: "cloned-7b")
            image_start = staticmethod(lambda: "<Img>")
            image_end = staticmethod(lambda: "</Img>")
            placeholder_token_id = staticmethod(lambda: 0)
            num_image_embeds = staticmethod(lambda: 4)
            embed_images = lambda self, images: None
            embed_tokens = staticmethod(lambda ids: None)
            placeholder_embeddings = staticmethod(lambda: None)

        available_pipelines = ["cloned-7b"]

        def get_pipeline(name, params):
            return Cloned(params) if name == "cloned-7b" else None
        """)
    shared.args.multimodal_pipeline = "cloned-7b"
    pipeline, _ = load_pipeline({**DEFAULT_PARAMS, "pipeline_dirs": [tmp_path]})
    weight = shared.model.get_input_embeddings().weight
    assert (pipeline.clip_device, pipeline.clip_dtype, pipeline.projector_dtype) == (weight.device, weight.dtype,
                                                                                     weight.dtype)
    assert pipeline._get_dtype("vision_bits", {"vision_bits": 16}, torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="expected 32, 16 or 'bf16'"):
        pipeline._get_dtype("vision_bits", {"vision_bits": 8})
