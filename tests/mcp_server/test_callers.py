"""The server adapters' records scope: principal, option, else the HTTP caller's credentials."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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


def _scope_of(context: Any, principal: str | None = None) -> str:
    adapter = ServerIdempotency(MemoryStore())
    return adapter._sep.scope_of(context, principal)


def test_http_callers_with_other_credentials_never_share_a_scope() -> None:
    alice = _scope_of(_context({"authorization": "Bearer alice"}))
    bob = _scope_of(_context({"authorization": "Bearer bob"}))
    by_key = _scope_of(_context({}, "api_key=alice"))
    assert len({alice, bob, by_key}) == 3
    assert "alice" not in alice  # only a hash of the credential
    assert alice == _scope_of(_context({"authorization": "bearer  alice"}))


def test_without_credentials_or_over_stdio_the_scope_is_the_shared_default() -> None:
    assert _scope_of(_context({})) == DEFAULT_SCOPE
    assert _scope_of(_context(None)) == DEFAULT_SCOPE


def test_an_authenticated_principal_wins_over_credentials() -> None:
    context = _context({"authorization": "Bearer alice"})
    assert _scope_of(context, "user-7") == "principal:user-7"
