"""The docs toolchain is pinned: docs-constraints.txt fixes every package of the [docs] extra,
and every install that builds the site uses it."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement

from tests.docs.markdown_blocks import ROOT

CONSTRAINTS = ROOT / "docs-constraints.txt"


def pins() -> dict[str, str]:
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"docs-constraints.txt: {line!r} is not pinned with =="
            found[re.sub(r"[-_.]+", "-", name).lower()] = version
    return found


def test_every_docs_requirement_is_pinned_within_its_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins()
    for spec in extras["optional-dependencies"]["docs"]:
        requirement = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pinned, f"{name} (the docs extra) is not in docs-constraints.txt"
        assert requirement.specifier.contains(pinned[name]), (spec, pinned[name])


def test_every_install_of_the_docs_extra_uses_the_constraints() -> None:
    assert (
        "-c docs-constraints.txt -e '.[all,test,docs]'" in (ROOT / "scripts" / "test").read_text()
    )
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'DOCS_CONSTRAINTS = "docs-constraints.txt"' in noxfile
    assert '"-c", DOCS_CONSTRAINTS' in noxfile
    readme = (ROOT / "README.md").read_text()
    assert "pip install -c docs-constraints.txt '.[docs]'" in readme
