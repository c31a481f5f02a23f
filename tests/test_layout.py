"""The layout's rules, read from the source: no import cycles, and the host imports no extension's code.

Every import counts, at module level or inside a function (a lazy import is still a dependency).
The host may import the `extensions` package itself (the loader lists its folders and imports
`extensions.NAME.script` by name at run time); it never imports an extension's modules, and only the
loaders import modules by a name computed at run time.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

# The host modules that import by a name known only at run time: extensions, and logits processors by class path.
DYNAMIC_IMPORTERS = {"modules.extensions", "modules.logits_processor_loader", "modules.vllm_logits"}


def project_modules() -> dict[str, Path]:
    files = [p for folder in ("modules", "extensions") for p in (ROOT / folder).rglob("*.py")] + [ROOT / "server.py"]
    modules = {}
    for path in files:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def imported(name: str, path: Path, known: dict) -> set[str]:
    """The project modules `name` imports (from X import Y counts X.Y when that is a module, else X)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[:-node.level] if not path.name == "__init__.py" else name.split(".")
                base = ".".join(package + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {module for module in found if module in known and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_and_the_host_imports_no_extension_code():
    known = project_modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert len(graph) > 30
    assert cycles(graph) == []
    host = {name: deps for name, deps in graph.items() if not name.startswith("extensions")}
    assert {(name, dep) for name, deps in host.items() for dep in deps if dep.startswith("extensions.")} == set()


def test_only_the_loaders_import_by_a_computed_name():
    for name, path in project_modules().items():
        if name.startswith("extensions") or name in DYNAMIC_IMPORTERS:
            continue
        calls = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Call)]
        dynamic = [ast.unparse(call) for call in calls if ast.unparse(call.func).endswith(("import_module", "__import__"))]
        assert dynamic == [], f"{path}: {dynamic} (reach extensions through hooks, not by name)"


def imported_tops(path: Path) -> set[str]:
    """The top-level packages `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found


def test_fixtures_serve_tests_bench_and_tools_but_never_the_product():
    product = list(project_modules().values())
    users = [p for folder in ("fixtures", "bench", "tools") for p in (ROOT / folder).rglob("*.py")]
    assert any(p.parent.name == "bench" for p in users) and any(p.parent.name == "fixtures" for p in users)
    wrong = [(str(p.relative_to(ROOT)), top) for p in product for top in imported_tops(p) & {"tests", "fixtures"}]
    wrong += [(str(p.relative_to(ROOT)), "tests") for p in users if "tests" in imported_tops(p)]
    assert wrong == [], "the product imports no fixtures; fixtures, bench and tools import nothing from tests/"
    assert list((ROOT / "fixtures").rglob("test_*.py")) == [], "fixtures/ holds no test modules"


def test_the_chat_turn_imports_without_gradio():
    """Only the UI needs Gradio: the chat turn, the generation and the API run where it is not installed
    (a GPU machine without it ran tools/gpu_check.sh through them, and failed when a module the chat turn
    imports imported Gradio at its top)."""
    code = ("import sys; sys.modules['gradio'] = None\n"
            "from modules import chat, text_generation, html_generator\n"
            "from modules.api import server")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
