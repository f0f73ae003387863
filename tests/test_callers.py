"""idemstore.callers: the one rule that tells callers apart, for every consumer."""

from __future__ import annotations

import pytest

from idemstore.callers import (
    DEFAULT_SOURCES,
    CallerSources,
    Source,
    caller_scope,
    fit_scope,
    normalize_field,
)
from idemstore.errors import ConfigurationError
from idemstore.records import MAX_SCOPE_LENGTH, check_identity

DEFAULT = CallerSources(DEFAULT_SOURCES)


def test_spellings_of_one_authorization_are_one_caller() -> None:
    spellings = ["Bearer alice", "bearer alice", "Bearer  alice", "BEARER\talice", " Bearer alice "]
    callers = {DEFAULT.caller([("authorization", value)]) for value in spellings}
    assert len(callers) == 1


def test_credentials_stay_case_sensitive() -> None:
    assert DEFAULT.caller([("authorization", "Bearer alice")]) != DEFAULT.caller(
        [("authorization", "Bearer ALICE")]
    )


def test_cookies_and_query_parameters_compare_as_sorted_pairs() -> None:
    a = DEFAULT.caller([("cookie", "session=s1; theme=dark")], "api_key=k&x=1")
    b = DEFAULT.caller([("cookie", "theme=dark;session=s1")], "x=1&api_key=k")
    assert a == b
    assert a != DEFAULT.caller([("cookie", "session=s2; theme=dark")], "api_key=k&x=1")


def test_a_request_without_any_source_has_no_caller() -> None:
    assert DEFAULT.caller([("x-api-key", "k"), ("authorization", "  ")], "") is None
    assert CallerSources(["header:x-api-key"]).caller([("x-api-key", "k")]) is not None


def test_named_sources_read_only_what_they_name() -> None:
    session = CallerSources(["cookie:session", "query:api_key"])
    assert session.caller([("cookie", "theme=dark")], "page=2") is None
    one = session.caller([("cookie", "theme=dark; session=s")], "page=2")
    other = session.caller([("cookie", "theme=light; session=s")], "page=3")
    assert one == other is not None


def test_sources_are_part_of_the_identity() -> None:
    # The same text under another source is another caller.
    by_header = CallerSources(["header:x-a", "header:x-b"])
    assert by_header.caller([("x-a", "v")]) != by_header.caller([("x-b", "v")])


@pytest.mark.parametrize("text", ["authorization", "body:x", "header:", "header:*", "header:a b"])
def test_a_bad_source_is_a_configuration_error(text: str) -> None:
    with pytest.raises(ConfigurationError):
        Source.parse(text)


def test_no_sources_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        CallerSources([])


def test_header_sources_are_case_insensitive() -> None:
    assert Source.parse("Header:X-Api-Key") == Source("header", "x-api-key")
    assert Source.parse("cookie:Session") == Source("cookie", "Session")


def test_normalize_field_lowercases_only_the_scheme_of_auth_headers() -> None:
    assert normalize_field("authorization", "Basic  QWxhZGRpbg==") == "basic QWxhZGRpbg=="
    assert normalize_field("x-tenant", "  Acme   Corp ") == "Acme Corp"


@pytest.mark.parametrize(
    "scope", ["x" * (MAX_SCOPE_LENGTH + 1), "a\x00b", "lone \ud800 surrogate", "ok/scope"]
)
def test_every_fitted_scope_is_one_every_store_accepts(scope: str) -> None:
    fitted = fit_scope(scope)
    check_identity("k", fitted)
    assert fit_scope(scope) == fitted  # one boundary, one scope
    assert (fitted == scope) == (scope == "ok/scope")


def test_caller_scopes_never_hold_the_raw_credential() -> None:
    caller = DEFAULT.caller([("authorization", "Bearer very-secret-token")])
    assert caller is not None
    scope = caller_scope("mcp-gateway/abc", caller)
    assert "very-secret-token" not in scope
    assert scope.startswith("mcp-gateway/abc/")
