"""The gateway's caller boundary: no caller ever gets a result recorded for another.

Against an upstream that authenticates (``tests.gateway.upstream --tokens``) by bearer token,
cookie, query parameter or API-key header, and whose ``whoami`` tool answers with the token
its call carried: a replay served to the wrong caller shows up as another caller's token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.gateway.conftest import gateway_url
from tests.gateway.processes import start_upstream
from tests.gateway.rpc import call, post

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.gateway.processes import Child, Upstream

KEYS: dict[str, dict[str, Any]] = {
    "sep": {"idempotencyKey": "same-key"},
    "meta": {"_meta": {"idempotency-key": "same-key"}},
    "derived": {},  # same tool, same arguments
}


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text("alice\nbob\n")
    return path


@pytest.fixture
def authenticating(tmp_path: Path, tokens: Path) -> Iterator[Upstream]:
    server = start_upstream(tmp_path, "stateless", tokens=tokens)
    try:
        yield server
    finally:
        server.child.stop()


def _credentials(way: str, token: str) -> tuple[dict[str, str], str]:
    """Headers and a query string presenting ``token`` the way an upstream accepts it."""
    if way == "bearer":
        return {"authorization": f"Bearer {token}"}, ""
    if way == "cookie":
        return {"cookie": f"theme=dark; session={token}"}, ""
    if way == "query":
        return {}, f"?api_key={token}"
    return {"x-api-key": token}, ""


def _text(answer: dict[str, Any]) -> str:
    return str(answer["result"]["content"][0]["text"])


@pytest.mark.parametrize("kind", list(KEYS))
@pytest.mark.parametrize("way", ["bearer", "cookie", "query", "api-key-header"])
async def test_callers_never_get_each_others_result_however_they_authenticate(
    authenticating: Upstream, gateways: Callable[..., Child], way: str, kind: str
) -> None:
    url = gateway_url(gateways(authenticating.url))
    async with httpx.AsyncClient(timeout=30) as client:
        texts = {}
        for n, token in enumerate(["alice", "bob"]):
            headers, query = _credentials(way, token)
            message = call(n, "whoami", {"n": 1}, **KEYS[kind])
            answer = await post(client, url + query, message, headers=headers)
            assert answer.status == 200, answer.body
            texts[token] = _text(answer.final())
    assert texts == {"alice": "1: alice", "bob": "1: bob"}
    assert authenticating.executions("whoami") == ["whoami", "whoami"]


@pytest.mark.parametrize("kind", list(KEYS))
@pytest.mark.parametrize("way", ["bearer", "cookie", "query"])
async def test_a_caller_without_credentials_gets_the_upstreams_401_not_a_recorded_result(
    authenticating: Upstream, gateways: Callable[..., Child], way: str, kind: str
) -> None:
    url = gateway_url(gateways(authenticating.url))
    headers, query = _credentials(way, "alice")
    async with httpx.AsyncClient(timeout=30) as client:
        message = call(1, "whoami", {"n": 1}, **KEYS[kind])
        alice = await post(client, url + query, message, headers=headers)
        nobody = await post(client, url, {**message, "id": 2}, headers={})
    assert _text(alice.final()) == "1: alice"
    assert nobody.status == 401
    assert nobody.headers["www-authenticate"] == "Bearer"
    assert authenticating.executions("whoami") == ["whoami"]


@pytest.mark.parametrize(
    ("way", "source"), [("cookie", "cookie:session"), ("query", "query:api_key")]
)
async def test_the_same_caller_is_deduplicated_by_a_named_cookie_or_query_parameter(
    authenticating: Upstream, gateways: Callable[..., Child], way: str, source: str
) -> None:
    # Named by the operator: a cookie or a query parameter is a credential only when named.
    url = gateway_url(gateways(authenticating.url, "memory://", "--caller", source))
    headers, query = _credentials(way, "alice")
    async with httpx.AsyncClient(timeout=30) as client:
        for n in range(3):
            message = call(n, "whoami", {"n": 1}, idempotencyKey="k")
            answer = await post(client, url + query, message, headers=headers)
            assert _text(answer.final()) == "1: alice"
    assert authenticating.executions("whoami") == ["whoami"]


async def test_an_api_key_header_names_callers_once_configured_as_a_source(
    authenticating: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(authenticating.url, "memory://", "--caller", "header:x-api-key"))
    async with httpx.AsyncClient(timeout=30) as client:
        texts = []
        for n, token in enumerate(["alice", "alice", "bob", "bob"]):
            message = call(n, "whoami", {"n": 1}, idempotencyKey="k")
            answer = await post(client, url, message, headers={"x-api-key": token})
            texts.append(_text(answer.final()))
    assert texts == ["1: alice", "1: alice", "1: bob", "1: bob"]
    assert authenticating.executions("whoami") == ["whoami", "whoami"]


async def test_spellings_of_one_credential_are_one_caller(
    authenticating: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(authenticating.url))
    async with httpx.AsyncClient(timeout=30) as client:
        for n, value in enumerate(
            ["Bearer alice", "bearer alice", "Bearer  alice", "BEARER\talice"]
        ):
            message = call(n, "whoami", {"n": 1}, idempotencyKey="k")
            answer = await post(client, url, message, headers={"authorization": value})
            assert _text(answer.final()) == "1: alice"
    assert authenticating.executions("whoami") == ["whoami"]


async def test_a_revoked_credential_gets_the_upstreams_refusal_not_the_replay(
    authenticating: Upstream, gateways: Callable[..., Child], tokens: Path
) -> None:
    url = gateway_url(gateways(authenticating.url))
    alice = {"authorization": "Bearer alice"}
    async with httpx.AsyncClient(timeout=30) as client:
        message = call(1, "whoami", {"n": 1}, idempotencyKey="k")
        first = await post(client, url, message, headers=alice)
        replay = await post(client, url, {**message, "id": 2}, headers=alice)
        tokens.write_text("bob\n")  # noqa: ASYNC240 -- alice's token is revoked upstream
        refused = await post(client, url, {**message, "id": 3}, headers=alice)
    assert _text(first.final()) == _text(replay.final()) == "1: alice"
    assert refused.status == 401
    assert refused.body == b"unauthorized"
    assert authenticating.executions("whoami") == ["whoami"]


async def test_replays_are_served_unverified_when_the_operator_opts_out(
    authenticating: Upstream, gateways: Callable[..., Child], tokens: Path
) -> None:
    url = gateway_url(gateways(authenticating.url, "memory://", "--no-verify-replays"))
    alice = {"authorization": "Bearer alice"}
    async with httpx.AsyncClient(timeout=30) as client:
        message = call(1, "whoami", {"n": 1}, idempotencyKey="k")
        await post(client, url, message, headers=alice)
        tokens.write_text("bob\n")  # noqa: ASYNC240 -- revoked
        replay = await post(client, url, {**message, "id": 2}, headers=alice)
    assert replay.status == 200
    assert _text(replay.final()) == "1: alice"


async def test_unidentified_callers_may_be_refused(
    authenticating: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(authenticating.url, "memory://", "--unidentified", "refuse"))
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await post(client, url, call(1, "whoami", {}, idempotencyKey="k"), headers={})
    assert answer.status == 400
    assert answer.final()["error"]["data"]["type"] == "idempotency_caller_unknown"
    assert authenticating.executions("whoami") == []


@pytest.mark.parametrize("upstream", ["stateless"], indirect=True)
async def test_unidentified_callers_share_one_scope_only_when_the_operator_says_so(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    relaying = gateway_url(gateways(upstream.url))
    sharing = gateway_url(gateways(upstream.url, "memory://", "--unidentified", "shared"))
    async with httpx.AsyncClient(timeout=30) as client:
        for url in (relaying, sharing):
            for n in range(2):
                message = call(n, "record", {"n": 1}, idempotencyKey="k")
                answer = await post(client, url, message, headers={})
                assert _text(answer.final()) == "recorded 1"
    # Relayed: both ran; shared: the second was a replay.
    assert upstream.executions("record") == ["record"] * 3
