"""The server adapters' records scope: principal, option, else the HTTP caller's named
credentials (``idemstore.callers``), else ``DEFAULT_SCOPE``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from idemstore.backends.memory import MemoryStore
from idemstore.mcp.server import DEFAULT_SCOPE, ServerIdempotency


def _context(headers: dict[str, str] | None, query: str = "") -> Any:
    """What the SDK hands a handler: over Streamable HTTP its ``request`` is the HTTP request."""
    if headers is None:
        return SimpleNamespace(request=None)  # stdio
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "query_string": query.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    return SimpleNamespace(request=Request(scope))


def _scope_of(context: Any, principal: str | None = None, **options: Any) -> str:
    adapter = ServerIdempotency(MemoryStore(), **options)
    return adapter._sep.scope_of(context, principal)


def test_http_callers_with_other_credentials_never_share_a_scope() -> None:
    alice = _scope_of(_context({"authorization": "Bearer alice"}))
    bob = _scope_of(_context({"authorization": "Bearer bob"}))
    assert len({alice, bob, DEFAULT_SCOPE}) == 3
    assert "alice" not in alice  # only a hash of the credential
    assert alice == _scope_of(_context({"authorization": "bearer  alice"}))


def test_without_credentials_or_over_stdio_the_scope_is_the_shared_default() -> None:
    assert _scope_of(_context({})) == DEFAULT_SCOPE
    assert _scope_of(_context(None)) == DEFAULT_SCOPE


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"authorization": "Bearer"}, ""),
        ({"authorization": "Basic "}, ""),
        ({"authorization": "Bearer undefined"}, ""),
        ({"cookie": "session=; consent=yes"}, ""),
        ({}, "api_key=alice"),
    ],
    ids=["bare-bearer", "basic-alone", "undefined", "cookies", "query"],
)
def test_credentials_that_name_nobody_or_are_not_named_count_as_none(
    headers: dict[str, str], query: str
) -> None:
    # The same scope as a request without credentials: never one of their own that only
    # strangers sending the same empty credential share.
    assert _scope_of(_context(headers, query)) == DEFAULT_SCOPE


def test_named_caller_sources_tell_callers_apart() -> None:
    sources = {"caller_sources": ["query:api_key", "cookie:session"]}
    alice = _scope_of(_context({}, "api_key=alice"), **sources)
    bob = _scope_of(_context({"cookie": "session=bob"}), **sources)
    assert len({alice, bob, DEFAULT_SCOPE}) == 3
    assert _scope_of(_context({"authorization": "Bearer a"}), **sources) == DEFAULT_SCOPE


def test_an_authenticated_principal_wins_over_credentials() -> None:
    context = _context({"authorization": "Bearer alice"})
    assert _scope_of(context, "user-7") == "principal:user-7"
