"""Every repository path a Markdown file names in backticks exists: docs that name moved code fail here.

The rule, kept simple on purpose. In each Markdown file of the repository (git's tracked files and
its untracked, not ignored, ones), an inline code span outside fenced blocks is a path when it is
made of path characters only (letters, digits, `_ . - /`) and either holds a `/` and starts with a
name the repository has (a file or folder anywhere in it), or is a bare module name (`chat.py`).
A path must be a file or folder of the repository, by its whole path (`modules/chat.py`) or by its
last segments (`core/ui.py`, `hf_auto/routes.py`: docs name code from their own folder).

Left out, each for a reason a reader can check:
- fenced code blocks: commands and file contents, not claims about where code lives;
- `../`, `./` and absolute paths: outside this repository (`../shared/tgw`, a user's `/tmp`);
- a first segment the repository does not have: hub ids (`liuhaotian/llava-v1.5-7b`), MIME types
  (`image/png`), text-generation-webui's folders (`user_data/extensions/`);
- bare names of other files (`config.json`, `pyproject.toml`): a kind of file, not a place here;
- placeholders: a segment in capitals without an extension (`pipelines/NAME/`); `<family>`, globs,
  URLs and calls hold other characters and are never read;
- paths git ignores (`models/config-user.yaml`, `test-artifacts/`): the user's files or generated;
- `fixtures/hub_templates/`: its README describes the hub's files as they are published.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SKIPPED_DOCS = ("fixtures/hub_templates/",)
FENCE_RE = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
SPAN_RE = re.compile(r"`([^`\n]+)`")
PATH_RE = re.compile(r"[\w.\-/]+")
PLACEHOLDER_RE = re.compile(r"(?:^|/)[A-Z][A-Z0-9_-]*(?:/|$)")


def git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True)
    except OSError as error:
        pytest.skip(f"git is needed to list the repository's files: {error}")


def repository_files() -> list[str]:
    listed = git("ls-files", "--cached", "--others", "--exclude-standard")
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so its files cannot be listed: {listed.stderr.strip()}")
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def tails(files: list[str]) -> set[str]:
    """Every file and folder of `files` by its whole path and by each of its shorter endings."""
    found = set()
    for name in files:
        parts = Path(name).parts
        for end in range(1, len(parts) + 1):
            found |= {"/".join(parts[start:end]) for start in range(end)}
    return found


def named_paths(text: str, segments: set[str]) -> list[str]:
    """The backticked spans of `text` that the rule above reads as paths (`segments`: the repository's names)."""
    spans = SPAN_RE.findall(FENCE_RE.sub("", text))
    return [span.rstrip("/") for span in spans
            if PATH_RE.fullmatch(span) and not span.startswith(("/", "./", "../")) and not PLACEHOLDER_RE.search(span)
            and (span.split("/", 1)[0] in segments if "/" in span else span.endswith(".py"))]


def missing_paths(doc: str, known: set[str], segments: set[str]) -> list[str]:
    absent = [path for path in named_paths((ROOT / doc).read_text(encoding="utf-8"), segments) if path not in known]
    ignored = set(git("check-ignore", "--stdin", stdin="\n".join(absent)).stdout.splitlines()) if absent else set()
    return [path for path in absent if path not in ignored]


def test_the_rule_reads_paths_and_leaves_the_rest():
    text = ("`modules/chat.py` `core/ui.py` `server.py` `modules/gone.py` `image/png` `../shared/tgw` `pipelines/NAME/` "
            "`<family>` `*.md` `https://x.org/a.py` `shared.model` `new_state()` `user_data/extensions/` "
            "`liuhaotian/llava-v1.5-7b` `config.json`\n```\npython tools/gone.py\n```\n")
    segments = {"modules", "chat.py", "core", "ui.py", "server.py", "pipelines", "tools"}
    assert named_paths(text, segments) == ["modules/chat.py", "core/ui.py", "server.py", "modules/gone.py"]


def test_every_path_the_docs_name_exists():
    files = repository_files()
    known = tails(files)
    segments = {part for name in files for part in Path(name).parts}
    docs = sorted(name for name in files if name.endswith(".md") and not name.startswith(SKIPPED_DOCS))
    missing = [f"{doc}: `{path}`" for doc in docs for path in missing_paths(doc, known, segments)]
    assert not missing, "Markdown files name paths that do not exist (moved or renamed code?):\n" + "\n".join(missing)
