"""The docs site as rendered: every page loads in headless Chromium with nothing unrendered,
every included example shown, every internal link and anchor resolving (rendered_site.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.docs import rendered_site
from tests.docs.markdown_blocks import ROOT

if TYPE_CHECKING:
    from pathlib import Path

# Each test starts Chromium or builds the site: once, in the slow lane.
pytestmark = pytest.mark.slow


def test_every_page_of_the_built_site_renders_in_a_browser_without_a_problem() -> None:
    site = rendered_site.checkout_site()
    assert len(rendered_site.built_pages(site)) > 20
    assert rendered_site.check_site(site) == []


def test_the_http_page_shows_the_payments_example_it_includes() -> None:
    assert rendered_site.included_examples((ROOT / "docs" / "http.md").read_text()) == [
        "examples/http_payments.py"
    ]


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        # what ruff format made of the include (commit 5ead87a)
        ('--8 < --"examples/http_payments.py"', "unrendered include or directive"),
        # an include inside a block that a formatter moved out of snippets' reach
        ('  --8<-- "examples/http_payments.py"', "is not shown whole"),
    ],
)
def test_a_broken_include_fails_the_check(tmp_path: Path, broken: str, expected: str) -> None:
    project = rendered_site.project_copy(tmp_path)
    page = project / "docs" / "http.md"
    text = page.read_text()
    assert '--8<-- "examples/http_payments.py"' in text
    page.write_text(text.replace('--8<-- "examples/http_payments.py"', broken))
    site = rendered_site.build_site(project, tmp_path / "site")
    problems = rendered_site.check_site(site, docs=project / "docs", only=["http/"])
    assert any(expected in p for p in problems), problems


def test_a_link_to_a_missing_anchor_fails_the_check(tmp_path: Path) -> None:
    project = rendered_site.project_copy(tmp_path)
    page = project / "docs" / "http.md"
    page.write_text(page.read_text() + "\nSee [nowhere](refusals.md#no-such-kind).\n")
    site = rendered_site.build_site(project, tmp_path / "site")
    problems = rendered_site.check_site(site, docs=project / "docs", only=["http/"])
    assert any("missing anchor: /refusals/#no-such-kind" in p for p in problems), problems


def test_ruff_format_leaves_the_snippet_includes_as_written() -> None:
    # ruff formats Python blocks in Markdown; an include line is not Python (<!-- fmt: off -->).
    diff = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--diff", "docs", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    mangled = [line for line in diff.splitlines() if line.startswith("-") and "--8<--" in line]
    assert not mangled, mangled
