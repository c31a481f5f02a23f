"""docs/ARCHITECTURE.md names exactly the files a picture turn runs, for an upload and for the API.

`tests/picture_path_trace.py` runs both turns on the shipped demo model in a fresh process, tracing
every thread, and reports the repository files whose functions ran.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
PATH_RE = re.compile(r"`((?:modules|extensions)/[\w/]+\.py|server\.py)`")


def section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def named(text: str) -> set[str]:
    return set(PATH_RE.findall(text))


def documented() -> dict[str, set[str]]:
    upload = named(section("A picture uploaded in the chat"))
    api = section("A picture sent to the API")
    not_run = named("".join(line for line in api.splitlines() if line.startswith("Not run:")))
    return {"upload": upload, "api": (upload - not_run) | (named(api) - not_run)}


def test_the_documented_path_is_the_path_a_picture_takes(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "picture_path_trace.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    traced = {entry: set(files) for entry, files in json.loads(run.stdout.strip().splitlines()[-1]).items()}
    assert "extensions/multimodal/pipelines/hf_auto/image_features.py" in traced["upload"], "the picture was embedded"
    for entry, files in documented().items():
        assert files == traced[entry], (entry, {"documented, not run": sorted(files - traced[entry]),
                                                "run, not documented": sorted(traced[entry] - files)})
