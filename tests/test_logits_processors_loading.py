"""Loading logits processors at start-up: class paths, entry points, class objects, and clear errors."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import server
from examples.target_token import TargetTokenAdapterProcessor, TargetTokenLogitsProcessor
from modules import logits_processor_loader as loader
from modules import shared
from modules.logits_processor_loader import LogitsProcessorLoadError
from modules.logits_processors import LogitsProcessor
from tests.conftest import ROOT

PLUGIN_HINT = "the test plug-in is not installed: pip install ./tests/plugin_package (requirements-dev.txt does)"


def test_a_class_path_resolves_to_its_class():
    assert loader.resolve("examples.target_token:TargetTokenLogitsProcessor") is TargetTokenLogitsProcessor


@pytest.mark.parametrize("path, message", [
    ("examples.target_token", "examples.target_token: not a class path; write it as module.path:ClassName"),
    (":Thing", ":Thing: not a class path"),
    ("no_such_package.mod:Thing", "no_such_package.mod:Thing: cannot import module 'no_such_package.mod'; check"),
    ("examples.target_token:Nope", "module 'examples.target_token' has no 'Nope'; its LogitsProcessor classes: "
                                   "TargetTokenAdapterProcessor, TargetTokenLogitsProcessor"),
    ("examples.target_token:target_of", "is a function, not a class"),
    ("collections:OrderedDict", "OrderedDict does not subclass modules.logits_processors.LogitsProcessor"),
])
def test_bad_class_paths_say_what_is_wrong(path, message):
    with pytest.raises(LogitsProcessorLoadError) as caught:
        loader.requested_classes([path], use_entry_points=False)
    assert message in str(caught.value) and str(caught.value).startswith(f"--logits-processors {path}: ")


def test_a_module_that_fails_inside_its_own_import_is_told_apart(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("import not_installed_dependency\n")
    (tmp_path / "raising_plugin.py").write_text("raise RuntimeError('no config file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LogitsProcessorLoadError, match="while importing it: No module named 'not_installed_dep"):
        loader.resolve("broken_plugin:X")
    with pytest.raises(LogitsProcessorLoadError, match="module 'raising_plugin' failed: RuntimeError: no config file"):
        loader.resolve("raising_plugin:X")


def test_class_objects_must_be_logits_processor_subclasses():
    assert loader.requested_classes([], [TargetTokenAdapterProcessor], use_entry_points=False) == \
        [TargetTokenAdapterProcessor]
    with pytest.raises(LogitsProcessorLoadError, match="dict does not subclass"):
        loader.requested_classes([], [dict], use_entry_points=False)
    with pytest.raises(LogitsProcessorLoadError, match="is a TargetTokenLogitsProcessor, not a class"):
        loader.requested_classes([], [TargetTokenLogitsProcessor.__new__(TargetTokenLogitsProcessor)],
                                 use_entry_points=False)


def test_a_class_named_twice_is_loaded_once():
    classes = loader.requested_classes(["examples.target_token:TargetTokenLogitsProcessor"],
                                       [TargetTokenLogitsProcessor, "examples.target_token:TargetTokenLogitsProcessor"],
                                       use_entry_points=False)
    assert classes == [TargetTokenLogitsProcessor]


def test_installed_entry_points_are_all_loaded():
    names = {point.name for point in entry_points(group=loader.ENTRY_POINT_GROUP)}
    assert "plugin_target_token" in names, PLUGIN_HINT
    classes = loader.requested_classes()
    plugin = next((c for c in classes if c.__name__ == "PluginTargetToken"), None)
    assert plugin is not None and issubclass(plugin, LogitsProcessor)
    assert len(loader.entry_point_classes()) == len(names)


class Abstract(LogitsProcessor):
    """Forgets apply()."""

    def __init__(self, config, device, is_pin_memory):
        pass

    def is_argmax_invariant(self):
        return True

    def update_state(self, batch_update):
        pass


class FailingConstructor(TargetTokenLogitsProcessor):
    def __init__(self, config, device, is_pin_memory):
        raise OSError("the word list is missing")


@pytest.mark.parametrize("cls, message", [
    (Abstract, "Constructing logits processor tests.test_logits_processors_loading:Abstract failed: TypeError: "
               "Can't instantiate abstract class"),
    (FailingConstructor, "FailingConstructor failed: OSError: the word list is missing"),
])
def test_processors_that_cannot_be_constructed_fail_start_up(host, cls, message):
    with pytest.raises(LogitsProcessorLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        loader.build_runner([cls])


def test_server_main_takes_class_objects_as_a_library(host, llama_dir):
    """`server.main(argv, logits_processors=[...])`; --nowebui without --api returns once started."""
    server.main(["--model", str(llama_dir), "--nowebui", "--logits-processors",
                 "examples.target_token:TargetTokenAdapterProcessor"], logits_processors=[TargetTokenLogitsProcessor])
    loaded = [type(p) for p in shared.logits_processors.processors]
    assert loaded[:2] == [TargetTokenAdapterProcessor, TargetTokenLogitsProcessor]


@pytest.mark.parametrize("spec, message", [
    ("no_such_package.mod:Thing", "cannot import module 'no_such_package.mod'"),
    ("collections:OrderedDict", "does not subclass modules.logits_processors.LogitsProcessor"),
])
def test_server_refuses_to_start_with_a_bad_processor(spec, message):
    done = subprocess.run([sys.executable, "server.py", "--nowebui", "--model", "no-model-needed",
                           "--logits-processors", spec], cwd=ROOT, capture_output=True, text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"Cannot start: --logits-processors {spec}: " in output and message in output
    assert "Traceback" not in output and "Loading" not in output, "fails before loading the model"
