"""The MCP SDK and FastMCP these tests ran against are inside the ``mcp`` extra's pins."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT


def mcp_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["optional-dependencies"]["mcp"]]
    return {requirement.name: requirement for requirement in requirements}


@pytest.mark.parametrize("distribution", ["mcp", "fastmcp"])
def test_tested_version_is_within_the_pinned_range(distribution: str) -> None:
    requirement = mcp_extra()[distribution]
    assert requirement.specifier.contains(version(distribution)), (
        f"{distribution} {version(distribution)} is outside {requirement}: "
        "rerun tests/mcp_server against it and move the pin"
    )
