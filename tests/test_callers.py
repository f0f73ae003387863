"""idemstore.callers: the one rule that tells callers apart, for every consumer."""

from __future__ import annotations

import pytest

from idemstore.callers import (
    DEFAULT_SOURCES,
    CallerSources,
    Principal,
    Source,
    caller_scope,
    describe_caller_rule,
    fit_scope,
    normalize_field,
    scope_of_caller,
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


def test_named_cookies_and_parameters_ignore_the_others() -> None:
    named = CallerSources(["cookie:session", "query:api_key"])
    a = named.caller([("cookie", "session=s1; _ga=GA1.1.111")], "api_key=k&x=1")
    b = named.caller([("cookie", "_ga=GA1.1.222;session=s1")], "x=2&api_key=k")
    assert a == b is not None
    assert a != named.caller([("cookie", "session=s2; _ga=GA1.1.111")], "api_key=k&x=1")


def test_by_default_only_credentials_by_definition_name_a_caller() -> None:
    assert DEFAULT.caller([("cookie", "session=s1; consent=yes")], "client=vscode") is None
    bearer = DEFAULT.caller([("authorization", "Bearer t")])
    assert bearer is not None
    assert DEFAULT.caller([("authorization", "Bearer t"), ("cookie", "_ga=GA1.1.2")]) == bearer
    assert DEFAULT.caller([("proxy-authorization", "Basic dTpw")]) is not None


@pytest.mark.parametrize(
    "header",
    [
        ("authorization", "Bearer"),
        ("authorization", "Basic "),
        ("authorization", "Bearer undefined"),
        ("authorization", "Bearer null"),
        ("authorization", "bearer  NULL "),
        ("authorization", ""),
        ("proxy-authorization", "Bearer"),
    ],
)
def test_a_credential_that_names_nobody_is_absent(header: tuple[str, str]) -> None:
    assert DEFAULT.caller([header]) is None


@pytest.mark.parametrize("cookie", ["session=", "session=undefined", "session=null"])
def test_an_empty_named_cookie_is_absent(cookie: str) -> None:
    assert CallerSources(["cookie:session"]).caller([("cookie", cookie)]) is None


@pytest.mark.parametrize("text", ["cookie:*", "query:*"])
def test_every_cookie_or_parameter_is_refused_as_an_identity(text: str) -> None:
    with pytest.raises(ConfigurationError, match="name the one that carries the credential"):
        Source.parse(text)


def test_a_principal_is_the_caller_whatever_credentials_it_sent() -> None:
    alice = Principal("user", "alice")
    one = scope_of_caller("http", alice, DEFAULT, [("authorization", "Bearer token-v1")])
    refreshed = scope_of_caller("http", alice, DEFAULT, [("authorization", "Bearer token-v2")])
    assert one == refreshed == "http/principal:user:alice"


def test_one_subject_in_two_realms_is_two_callers() -> None:
    django_user = scope_of_caller("http", Principal("django-user", "1"), None)
    remote_user = scope_of_caller("http", Principal("remote-user", "1"), None)
    assert django_user != remote_user


@pytest.mark.parametrize("subject", ["", "   ", None, True, object()])
def test_a_subject_that_names_nobody_is_no_principal(subject: object) -> None:
    assert Principal.of("user", subject) is None


def test_without_principal_or_credential_nobody_can_tell() -> None:
    assert scope_of_caller("http", None, DEFAULT, [("cookie", "consent=yes")]) is None
    assert scope_of_caller("http", None, None, [("authorization", "Bearer t")]) is None


def test_the_startup_line_says_a_refreshed_credential_is_a_new_caller() -> None:
    line = describe_caller_rule("scope['user'].identity", DEFAULT)
    assert "refreshed credential is a new caller" in line
    assert "header:authorization" in line


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
