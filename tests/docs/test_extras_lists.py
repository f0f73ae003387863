"""The README's and the quickstart's lists of extras name every extra a user installs."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import ROOT

# The project's own: building the docs site and running its test suite.
FOR_THE_PROJECT = {"docs", "test"}


def user_extras() -> set[str]:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(declared["optional-dependencies"]) - FOR_THE_PROJECT


def test_the_readme_lists_every_extra_the_project_s_own_too() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"^Extras: (.*?);", readme, re.MULTILINE | re.DOTALL)
    assert listed, "README.md has no 'Extras: ...;' line"
    # the project's own extras too: whoever works on idemstore reads the README first
    assert set(re.findall(r"`\[([\w-]+)\]`", listed[1])) == user_extras() | FOR_THE_PROJECT


def test_the_quickstart_table_lists_every_extra() -> None:
    quickstart = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w-]+)` \|", quickstart, re.MULTILINE)
    assert set(rows) == user_extras()
