"""The docs' API reference documents every public name, from its docstring."""

from __future__ import annotations

import re

import idemstore
from tests.conftest import ROOT

REFERENCE = ROOT / "docs" / "reference"
# mkdocstrings renders a name where a line reads "::: dotted.path" (options may follow).
DIRECTIVE = re.compile(r"^:::\s+(\S+)\s*$", re.MULTILINE)


def documented_names() -> list[str]:
    """Every top-level ``idemstore.<name>`` the reference pages render, in page order."""
    names = []
    for page in sorted(REFERENCE.rglob("*.md")):
        for target in DIRECTIVE.findall(page.read_text()):
            module, _, name = target.rpartition(".")
            if module == "idemstore":
                names.append(name)
    return names


def test_every_name_in_all_has_an_entry_in_the_api_reference() -> None:
    missing = sorted(set(idemstore.__all__) - set(documented_names()))
    assert not missing, f"add '::: idemstore.NAME' to a page under docs/reference/ for {missing}"


def test_the_api_reference_documents_only_public_names_each_once() -> None:
    names = documented_names()
    stale = sorted(set(names) - set(idemstore.__all__))
    assert not stale, f"documented but not in idemstore.__all__: {stale}"
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"documented twice: {twice}"


def test_every_public_name_has_its_own_docstring() -> None:
    # The reference is generated from docstrings: a name without one renders as a bare
    # signature. A dataclass without a docstring gets "Name(field: type, ...)" from the
    # dataclass machinery, which is no documentation either.
    undocumented = []
    for name in idemstore.__all__:
        if name == "__version__":
            continue
        obj = getattr(idemstore, name)
        # a class's own docstring, not one inherited from a base class
        doc = (vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__) or ""
        if not doc.strip() or doc.startswith(f"{name}("):
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_the_reference_pages_are_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in REFERENCE.rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in nav, page
