"""The docs site as rendered: every page loads in headless Chromium with nothing unrendered,
every included example shown, every internal link and anchor resolving (rendered_site.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.docs import rendered_site
from tests.docs.markdown_blocks import ROOT

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


INCLUDE = '--8<-- "examples/http_payments.py"'


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What the check finds in a copy of the docs with planted breaks (one build, one
    browser session for all): on http.md the include as ruff format rewrote it (commit
    5ead87a); on sync.md an include indented out of snippets' reach, a dangling anchor
    and a script that throws."""
    tmp = tmp_path_factory.mktemp("planted")
    project = rendered_site.project_copy(tmp)
    http = project / "docs" / "http.md"
    assert INCLUDE in http.read_text()
    http.write_text(http.read_text().replace(INCLUDE, '--8 < --"examples/http_payments.py"'))
    sync = project / "docs" / "sync.md"
    sync.write_text(
        sync.read_text()
        + f"\n```python\n  {INCLUDE}\n```\n\nSee [nowhere](refusals.md#no-such-kind).\n"
        + "\n<script>planted_call_of_no_function()</script>\n"
    )
    site = rendered_site.build_site(project, tmp / "site")
    return rendered_site.check_site(site, docs=project / "docs", only=["http/", "sync/"])


def test_an_include_mangled_by_a_formatter_fails_the_check(planted: list[str]) -> None:
    assert any(p.startswith("/http/: unrendered include") for p in planted), planted


def test_an_include_that_did_not_pull_its_file_in_fails_the_check(planted: list[str]) -> None:
    assert any(
        p.startswith("/sync/: examples/http_payments.py") and "not shown whole" in p
        for p in planted
    ), planted


def test_a_link_to_a_missing_anchor_fails_the_check(planted: list[str]) -> None:
    assert "/sync/: link to a missing anchor: /refusals/#no-such-kind" in planted, planted


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


def test_a_script_error_on_a_page_fails_the_check(planted: list[str]) -> None:
    assert any(
        p.startswith("/sync/: console error") and "planted_call_of_no_function" in p
        for p in planted
    ), planted
