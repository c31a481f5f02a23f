"""The hook lists in the docs name the hooks the code has: docs that list hooks fail here when a hook
is added, renamed or dropped without them.

- `extensions/multimodal/script.py`'s docstring lists, under "Hooks, in the order the host calls
  them:", one `- `name(...)`` item per hook (two names may share an item): exactly the hooks the
  module defines, `custom_generate_reply` included (its module `__getattr__` offers it).
- docs/ARCHITECTURE.md's "The order of the hooks" names every hook the host calls during a chat
  turn: each entry of `modules/extensions.py`'s EXTENSION_MAP but `css` and `js` (the UI's build),
  by its key (`chat_input`) or its function's name (`custom_tokenized_length`).
A hook is a name the host calls: `setup` and `ui`, and the function names EXTENSION_MAP calls.
"""
from __future__ import annotations

import functools
import inspect
import re

from modules import extensions
from tests.conftest import ROOT

UI_BUILD = {"css", "js"}  # called while the page is built, not during a turn
HOOKS_HEADING = "Hooks, in the order the host calls them:"
ITEM_RE = re.compile(r"^- ((?:`\w+\([^`]*\)`(?:, )?)+)", re.MULTILINE)


def hook_functions() -> dict[str, str]:
    """EXTENSION_MAP's keys -> the function name each calls on an extension."""
    names = {}
    for key, apply in extensions.EXTENSION_MAP.items():
        if isinstance(apply, functools.partial):
            names[key] = apply.args[0]
        else:  # a function of its own, e.g. chat_input's: the one name it looks up
            [names[key]] = set(re.findall(r'hasattr\(extension, "(\w+)"\)', inspect.getsource(apply)))
    return names


def host_hooks() -> set[str]:
    return {"setup", "ui", *hook_functions().values()}


def defined_hooks(module) -> set[str]:
    """The hooks `module` defines, and those its module-level `__getattr__` may offer."""
    defined = {name for name in host_hooks() if callable(vars(module).get(name))}
    if "__getattr__" in vars(module):
        defined |= set(re.findall(r'name == "(\w+)"', inspect.getsource(module.__getattr__))) & host_hooks()
    return defined


def documented_hooks(docstring: str) -> set[str]:
    """The hooks of the list under HOOKS_HEADING: the names at the start of each `- ` item."""
    assert HOOKS_HEADING in docstring, f"the docstring lost its heading {HOOKS_HEADING!r}"
    listing = docstring.split(HOOKS_HEADING, 1)[1]
    return {name for item in ITEM_RE.findall(listing) for name in re.findall(r"`(\w+)\(", item)}


def unnamed_turn_hooks(section: str) -> list[str]:
    """EXTENSION_MAP's per-turn entries that `section` names neither by key nor by function name."""
    said = set(re.findall(r"\w+", section))
    return sorted(key for key, function in hook_functions().items()
                  if key not in UI_BUILD and key not in said and function not in said)


def architecture_hooks_section() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    return text.split("## The order of the hooks", 1)[1].split("\n## ", 1)[0]


def test_the_checks_can_fail():
    docstring = f"{HOOKS_HEADING}\n- `setup()`: once.\n- `ui()`: the input.\n- `a_b(x)`, `c(y)` (this host): z.\nMore."
    assert documented_hooks(docstring) == {"setup", "ui", "a_b", "c"}
    section = architecture_hooks_section()
    assert unnamed_turn_hooks(section) == []
    assert unnamed_turn_hooks(section.replace("engine_prompt", "an engine's hook")) == ["engine_prompt"]


def test_script_lists_exactly_the_hooks_it_defines():
    from extensions.multimodal import script

    defined, documented = defined_hooks(script), documented_hooks(script.__doc__)
    assert "custom_generate_reply" in defined and "chat_input_modifier" in defined
    assert documented == defined, (f"script.py defines but does not list: {sorted(defined - documented)}; "
                                   f"lists but does not define: {sorted(documented - defined)}")


def test_architecture_names_every_hook_of_a_turn():
    assert unnamed_turn_hooks(architecture_hooks_section()) == [], \
        "docs/ARCHITECTURE.md's 'The order of the hooks' does not name these EXTENSION_MAP hooks"


def test_the_example_extension_documents_every_hook_the_host_calls():
    """extensions/example/script.py is where an extension's author reads the hooks (README's Layout)."""
    example = (ROOT / "extensions" / "example" / "script.py").read_text(encoding="utf-8")
    missing = sorted(name for name in host_hooks() if f"`{name}(" not in example and f"def {name}(" not in example)
    assert missing == [], f"extensions/example/script.py does not document {missing}"
