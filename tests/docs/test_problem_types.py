"""Every refusal's problem ``type`` leads to its section of the built refusals page."""

from __future__ import annotations

import re
import tomllib
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest

from idemstore.execution.refusals import Refusal
from idemstore.problems import DEFAULT_DOCS_URL, DOCS_URL_ENV, problem_type
from tests.docs import rendered_site
from tests.docs.markdown_blocks import ROOT

SERVED_AT = "https://docs.example.com/idemstore/"


def _anchor_on_the_built_page(uri: str, docs_url: str) -> bool:
    page, fragment = urldefrag(uri)
    # the page as a path of the site: the part of the URI under the docs' address
    assert page.startswith(docs_url), (page, docs_url)
    html = rendered_site.checkout_site() / page.removeprefix(docs_url) / "index.html"
    return f'id="{fragment}"' in html.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("refusal", list(Refusal))
def test_each_refusal_s_type_has_its_anchor_on_the_built_refusals_page(
    refusal: Refusal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)
    assert _anchor_on_the_built_page(problem_type(refusal), DEFAULT_DOCS_URL)
    monkeypatch.setenv(DOCS_URL_ENV, SERVED_AT)
    assert _anchor_on_the_built_page(problem_type(refusal), SERVED_AT)


def test_the_docs_address_sets_the_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DOCS_URL_ENV, "https://docs.example.com/idemstore")  # no final slash
    assert problem_type(Refusal.CONFLICT) == "https://docs.example.com/idemstore/refusals/#conflict"


def test_by_default_the_type_is_a_relative_reference_to_the_docs_site_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)
    uri = problem_type(Refusal.IN_PROGRESS)
    assert uri == "/idemstore/docs/refusals/#in_progress"
    resolved = urljoin("https://api.example.com/payments", uri)
    assert resolved == "https://api.example.com/idemstore/docs/refusals/#in_progress"
    # the site's path is the one pyproject.toml's Documentation URL gives it (one fact)
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urlsplit(urls["Documentation"]).path == DEFAULT_DOCS_URL


def test_the_refusals_page_documents_the_setting() -> None:
    page = (ROOT / "docs" / "refusals.md").read_text()
    assert re.search(rf"export {DOCS_URL_ENV}=", page)
    assert DEFAULT_DOCS_URL in page
