"""Who the caller is at the ASGI door (issue #40): a principal first, else the credentials the
operator names, else a 400; never a display name, never a sweep of every cookie."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser
from starlette.middleware.authentication import AuthenticationMiddleware

from idemstore.callers import Principal
from tests.http.apps import create_app
from tests.http.conftest import assert_replay_of, calls, client_of, keyed

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx
    from starlette.applications import Starlette

    from idemstore.protocol import IdempotencyStore

AppClient = tuple["Starlette", "httpx.AsyncClient"]

# Present, but they identify nobody: two strangers sending them are not one caller.
NAMES_NOBODY = {
    "bare-bearer": {"Authorization": "Bearer"},
    "basic-alone": {"Authorization": "Basic"},
    "empty-session-cookie": {"Cookie": "session="},
    "constant-consent-cookie": {"Cookie": "consent=yes"},
}


async def post(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    return await client.post("/orders", json={"sku": "A1"}, headers=headers)


async def test_spellings_of_one_credential_are_one_caller(app_client: AppClient) -> None:
    app, client = app_client
    for value in ["Bearer alice", "bearer alice", "Bearer  alice", "BEARER\talice"]:
        response = await post(client, keyed("k", {"Authorization": value}))
        assert response.status_code == 201
    assert calls(app, "create_order") == 1


async def test_a_changed_analytics_cookie_is_the_same_caller(app_client: AppClient) -> None:
    # Issue #40, case 2: the same bearer token, _ga changed between the try and the retry.
    app, client = app_client
    token = {"Authorization": "Bearer ann-token"}
    first = await post(client, keyed("k", {**token, "Cookie": "_ga=GA1.1.111"}))
    again = await post(client, keyed("k", {**token, "Cookie": "_ga=GA1.1.222"}))
    assert_replay_of(again, first)
    assert calls(app, "create_order") == 1


@pytest.mark.parametrize("credentials", NAMES_NOBODY.values(), ids=NAMES_NOBODY.keys())
async def test_credentials_that_name_nobody_are_refused(
    app_client: AppClient, credentials: dict[str, str]
) -> None:
    # Issue #40, case 3: two people, one key; the second used to get the first's 201.
    app, client = app_client
    first = await post(client, keyed("k", credentials))
    second = await post(client, keyed("k", credentials))
    assert first.status_code == second.status_code == 400
    assert "caller" in second.json()["detail"]
    assert calls(app, "create_order") == 0


async def test_a_named_session_cookie_names_the_caller(make_client: Callable[..., Any]) -> None:
    app, client = make_client(caller_sources=["cookie:session"])
    async with client:
        statuses = []
        for session in ["alice", "alice", "bob"]:
            response = await post(client, keyed("k", {"Cookie": f"session={session}; _ga=1"}))
            statuses.append(response.status_code)
    assert statuses == [201, 201, 201]
    assert calls(app, "create_order") == 2  # alice's retry replayed; bob ran his own


async def test_cookies_not_named_are_no_credential(app_client: AppClient) -> None:
    _, client = app_client
    response = await post(client, keyed("k", {"Cookie": "session=alice"}))
    assert response.status_code == 400


async def test_a_caller_callable_keeps_one_user_across_a_token_refresh(
    make_client: Callable[..., Any],
) -> None:
    # Issue #40, case 1: ann's token is refreshed between her try and her retry.
    tokens = {"Bearer token-v1": "ann", "Bearer token-v2": "ann", "Bearer token-b": "ben"}

    def caller(scope: Any) -> Principal | None:
        for name, value in scope["headers"]:
            if name == b"authorization" and value.decode() in tokens:
                return Principal("accounts", tokens[value.decode()])
        return None

    app, client = make_client(caller=caller)
    async with client:
        first = await post(client, keyed("k", {"Authorization": "Bearer token-v1"}))
        ben = await post(client, keyed("k", {"Authorization": "Bearer token-b"}))
        again = await post(client, keyed("k", {"Authorization": "Bearer token-v2"}))
    assert_replay_of(again, first)
    assert "idempotent-replayed" not in ben.headers
    assert calls(app, "create_order") == 2


async def test_a_constant_caller_shares_keys_on_purpose(make_client: Callable[..., Any]) -> None:
    app, client = make_client(caller=lambda scope: "public")
    async with client:
        first = await post(client, keyed("k", {}))
        again = await post(client, keyed("k", {"Cookie": "someone=else"}))
    assert_replay_of(again, first)
    assert calls(app, "create_order") == 1


class _User(BaseUser):
    """A Starlette user whose identity may be empty, or not implemented at all (None)."""

    def __init__(self, identity: str | None, display_name: str) -> None:
        self._identity = identity
        self._display_name = display_name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self._display_name

    @property
    def identity(self) -> str:
        if self._identity is None:
            raise NotImplementedError  # BaseUser's own identity
        return self._identity


class _HeaderAuth(AuthenticationBackend):
    """``X-User: <identity>`` ("-" for a user class without ``identity``), "Alex Smith" always."""

    async def authenticate(self, conn: Any) -> Any:
        user = conn.headers.get("x-user")
        if user is None:
            return None
        return AuthCredentials(["authenticated"]), _User(
            None if user == "-" else user, "Alex Smith"
        )


def authenticated_app(store: IdempotencyStore) -> Starlette:
    app = create_app("starlette", store)
    # Added last, so it runs first and the idempotency middleware sees scope["user"].
    app.add_middleware(AuthenticationMiddleware, backend=_HeaderAuth())
    return app


async def test_the_authenticated_user_is_the_caller_across_a_token_refresh(
    store: IdempotencyStore,
) -> None:
    app = authenticated_app(store)
    async with client_of(app) as client:
        first = await post(client, keyed("k", {"X-User": "u-1", "Authorization": "Bearer v1"}))
        again = await post(client, keyed("k", {"X-User": "u-1", "Authorization": "Bearer v2"}))
        other = await post(client, keyed("k", {"X-User": "u-2", "Authorization": "Bearer v1"}))
    assert_replay_of(again, first)
    assert "idempotent-replayed" not in other.headers
    assert calls(app, "create_order") == 2


async def test_a_display_name_never_names_the_caller(store: IdempotencyStore) -> None:
    # Issue #40, case 5: two users named "Alex Smith" without an identity shared records.
    app = authenticated_app(store)
    async with client_of(app) as client:
        first = await post(client, keyed("k", {"X-User": ""}))
        second = await post(client, keyed("k", {"X-User": ""}))
        with_token = await post(client, keyed("k", {"X-User": "", "Authorization": "Bearer a"}))
        other_token = await post(client, keyed("k", {"X-User": "", "Authorization": "Bearer b"}))
    assert first.status_code == second.status_code == 400
    # No principal: the credentials decide, each caller their own.
    assert with_token.status_code == other_token.status_code == 201
    assert "idempotent-replayed" not in other_token.headers
    assert calls(app, "create_order") == 2


async def test_a_user_without_identity_is_no_principal_not_a_500(store: IdempotencyStore) -> None:
    # Issue #40, case 5: Starlette's BaseUser raises NotImplementedError for identity.
    app = authenticated_app(store)
    async with client_of(app, raise_app_exceptions=False) as client:
        anonymous = await post(client, keyed("k", {"X-User": "-"}))
        first = await post(client, keyed("k", {"X-User": "-", "Authorization": "Bearer a"}))
        again = await post(client, keyed("k", {"X-User": "-", "Authorization": "Bearer a"}))
    assert anonymous.status_code == 400
    assert first.status_code == 201
    assert_replay_of(again, first)


def test_the_caller_rule_is_logged_once_at_start_up(
    store: IdempotencyStore, caplog: pytest.LogCaptureFixture
) -> None:
    from idemstore.http.asgi import IdempotencyMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    with caplog.at_level("INFO", logger="idemstore.http"):
        IdempotencyMiddleware(app, store=store)
        IdempotencyMiddleware(app, store=store, caller=lambda scope: None, caller_sources=None)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "idemstore.http"]
    assert 'scope["user"].identity' in line
    assert "header:authorization" in line and "refreshed credential is a new caller" in line
