"""DOCS.md's two method tables name exactly the methods of `AbstractMultimodalPipeline`: the abstract
ones in "The abstract methods", every other public one in "Optional capabilities". A method added to
the class and not to DOCS.md, or documented and not in the class, fails here."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline

DOCS = Path(__file__).resolve().parent.parent / "extensions" / "multimodal" / "DOCS.md"
METHOD = re.compile(r"`(\w+)\(")


def table_methods(heading: str) -> list[str]:
    """The method names in the first column of the table under `### heading`."""
    section = DOCS.read_text(encoding="utf-8").split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in METHOD.findall(row.split(" | ")[0])]


def class_methods() -> set[str]:
    return {name for name, value in vars(AbstractMultimodalPipeline).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, staticmethod))}


def test_the_abstract_methods_table_is_the_class_s_abstract_methods():
    documented = table_methods("The abstract methods")
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == set(AbstractMultimodalPipeline.__abstractmethods__)


def test_the_optional_capabilities_table_is_every_other_public_method():
    documented = table_methods("Optional capabilities")
    assert len(documented) == len(set(documented)), documented
    expected = class_methods() - set(AbstractMultimodalPipeline.__abstractmethods__)
    assert set(documented) == expected, (f"in the class, not in DOCS.md: {sorted(expected - set(documented))}; "
                                         f"in DOCS.md, not in the class: {sorted(set(documented) - expected)}")
