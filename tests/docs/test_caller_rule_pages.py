"""Every page about a door says who the caller is in the same words: one paragraph, written
once in docs/http.md between ``<!-- caller-rule -->`` markers, repeated verbatim elsewhere."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

PAGES = ["http.md", "fastapi.md", "wsgi.md", "django.md", "celery.md", "refusals.md"]
_RULE = re.compile(r"<!-- caller-rule -->\n(.*?)<!-- /caller-rule -->", re.DOTALL)


def rule_of(page: str) -> str:
    found = _RULE.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))
    assert len(found) == 1, f"docs/{page} must hold the caller rule once"
    return str(found[0])


@pytest.mark.parametrize("page", PAGES[1:])
def test_the_page_repeats_the_caller_rule_of_the_http_page(page: str) -> None:
    assert rule_of(page) == rule_of("http.md")


PRINCIPLE_PAGES = [*PAGES, "gateway.md"]
_PRINCIPLE = re.compile(r"<!-- caller-principle -->\n(.*?)<!-- /caller-principle -->", re.DOTALL)


@pytest.mark.parametrize("page", PRINCIPLE_PAGES)
def test_every_door_page_states_the_one_caller_rule_in_the_same_words(page: str) -> None:
    found = _PRINCIPLE.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))
    http = _PRINCIPLE.findall((ROOT / "docs" / "http.md").read_text(encoding="utf-8"))
    assert len(found) == 1, f"docs/{page} must state the caller rule once"
    assert found == http


def test_the_caller_rule_names_every_option_of_the_doors() -> None:
    rule = rule_of("http.md")
    for words in ("`caller`", "`caller_sources`", "`trust_remote_user`", "400", "refreshed"):
        assert words in rule
