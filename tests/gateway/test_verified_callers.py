"""Verified callers (issue 40, case 7): the gateway checks the bearer token itself.

Against an upstream that authorizes inside its ``charge`` tool and answers ``ping`` for anyone
(``tests.gateway.upstream --jwks``), and a test issuer whose keys the test makes
(``tests.gateway.issuer``): a refreshed token of one subject replays; an expired, forged,
wrong-audience or revoked token never gets a replay and reaches the upstream, whose tool
refuses it. On the pre-fix gateway (f9d2f28) none of these start: it has no ``jwt:`` caller,
and its credential hash replays a revoked token whenever the upstream answers the ping.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.gateway.conftest import gateway_url
from tests.gateway.issuer import AUDIENCE, CLIENT, ISSUER, Issuer, new_key, serve_issuer
from tests.gateway.processes import start_upstream
from tests.gateway.rpc import call, post

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.gateway.processes import Child, Upstream

KEYS: dict[str, dict[str, Any]] = {
    "sep": {"idempotencyKey": "charge-1"},
    "derived": {},  # the same tool and arguments, no key
}


@pytest.fixture
def issuer(tmp_path: Path) -> Issuer:
    return Issuer(tmp_path / "jwks.json")


@pytest.fixture
def issuer_url(issuer: Issuer) -> Iterator[str]:
    yield from serve_issuer(issuer)


@pytest.fixture
def revoked(tmp_path: Path) -> Path:
    path = tmp_path / "revoked"
    path.write_text("")
    return path


@pytest.fixture
def charging(tmp_path: Path, issuer: Issuer, revoked: Path) -> Iterator[Upstream]:
    """The upstream whose ``charge`` tool checks the token itself."""
    assert issuer.jwks_file is not None
    server = start_upstream(tmp_path, "stateless", jwks=issuer.jwks_file, revoked=revoked)
    try:
        yield server
    finally:
        server.child.stop()


def jwt_options(jwks: str, *more: str) -> tuple[str, ...]:
    return (
        "--caller",
        "jwt:sub",
        "--jwks",
        jwks,
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        AUDIENCE,
        *more,
    )


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _text(answer: dict[str, Any]) -> str:
    return str(answer["result"]["content"][0]["text"])


async def _charge(url: str, token: str, n: int, kind: str = "sep") -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await post(
            client, url, call(n, "charge", {"amount": 5}, **KEYS[kind]), headers=_bearer(token)
        )
    assert answer.status == 200, answer.body
    return answer.final()


@pytest.mark.parametrize("kind", list(KEYS))
async def test_a_refreshed_token_of_the_same_subject_replays(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer, kind: str
) -> None:
    assert issuer.jwks_file is not None
    url = gateway_url(gateways(charging.url, "memory://", *jwt_options(str(issuer.jwks_file))))
    first = await _charge(url, issuer.token("alice"), 1, kind)
    refreshed = await _charge(url, issuer.token("alice"), 2, kind)  # new bytes, same sub
    assert _text(first) == _text(refreshed) == "charged 5 to alice"
    assert charging.executions("charge") == ["charge"]


async def test_two_subjects_never_share_a_record(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer
) -> None:
    assert issuer.jwks_file is not None
    url = gateway_url(gateways(charging.url, "memory://", *jwt_options(str(issuer.jwks_file))))
    alice = await _charge(url, issuer.token("alice"), 1)
    bob = await _charge(url, issuer.token("bob"), 2)
    assert (_text(alice), _text(bob)) == ("charged 5 to alice", "charged 5 to bob")
    assert charging.executions("charge") == ["charge", "charge"]


def _refused(answer: dict[str, Any]) -> None:
    """The upstream's own tool answered (it refused the token): not a replay."""
    assert answer["result"]["isError"] is True
    assert "unauthorized" in _text(answer)


async def test_an_expired_token_gets_no_replay_and_the_upstream_answers_it(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer
) -> None:
    assert issuer.jwks_file is not None
    options = jwt_options(str(issuer.jwks_file), "--jwt-leeway", "0")
    url = gateway_url(gateways(charging.url, "memory://", *options))
    token = issuer.token("alice", ttl=2)
    assert _text(await _charge(url, token, 1)) == "charged 5 to alice"
    expires = issuer.minted[token]["exp"]
    await asyncio.sleep(max(0.0, expires - time.time()) + 1.1)  # the upstream's clock: no seam
    _refused(await _charge(url, token, 2))  # the same token, now expired
    assert charging.executions() == ["charge", "refused"]


@pytest.mark.parametrize("kind", list(KEYS))
async def test_a_forged_token_gets_no_replay_and_the_upstream_answers_it(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer, kind: str
) -> None:
    assert issuer.jwks_file is not None
    url = gateway_url(gateways(charging.url, "memory://", *jwt_options(str(issuer.jwks_file))))
    await _charge(url, issuer.token("alice"), 1, kind)
    # alice's claims and the issuer's kid, signed by a key that is not the issuer's.
    forged = issuer.token("alice", key=new_key())
    _refused(await _charge(url, forged, 2, kind))
    assert charging.executions() == ["charge", "refused"]


async def test_a_token_for_another_audience_gets_no_replay(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer
) -> None:
    assert issuer.jwks_file is not None
    url = gateway_url(gateways(charging.url, "memory://", *jwt_options(str(issuer.jwks_file))))
    await _charge(url, issuer.token("alice"), 1)
    elsewhere = issuer.token("alice", aud="https://another-service.test")
    _refused(await _charge(url, elsewhere, 2))
    assert charging.executions() == ["charge", "refused"]


async def test_a_revoked_token_gets_no_replay_with_introspection(
    charging: Upstream,
    gateways: Callable[..., Child],
    issuer: Issuer,
    issuer_url: str,
    revoked: Path,
) -> None:
    options = (
        "--caller",
        "jwt:sub",
        "--introspect",
        f"{issuer_url}/introspect",
        "--introspect-client-id",
        CLIENT[0],
        "--introspect-client-secret",
        CLIENT[1],
        "--introspect-cache",
        "0",
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        AUDIENCE,
    )
    url = gateway_url(gateways(charging.url, "memory://", *options))
    token = issuer.token("alice")
    first = await _charge(url, token, 1)
    refreshed = await _charge(url, issuer.token("alice"), 2)
    assert _text(first) == _text(refreshed) == "charged 5 to alice"
    issuer.revoked.add(token)
    revoked.write_text(token)  # noqa: ASYNC240 -- the upstream's tool refuses it too
    _refused(await _charge(url, token, 3))
    assert charging.executions() == ["charge", "refused"]


async def test_a_rotated_signing_key_is_fetched_from_the_jwks_url(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer, issuer_url: str
) -> None:
    url = gateway_url(gateways(charging.url, "memory://", *jwt_options(f"{issuer_url}/jwks")))
    await _charge(url, issuer.token("alice"), 1)
    issuer.rotate(kind="ec")  # a new kid, the old key gone
    replay = await _charge(url, issuer.token("alice"), 2)
    assert _text(replay) == "charged 5 to alice"
    assert charging.executions() == ["charge"]
    assert issuer.fetches == 2  # once cold, once for the unknown kid


async def test_a_verified_gateway_says_how_it_tells_callers_apart(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer
) -> None:
    assert issuer.jwks_file is not None
    child = gateways(charging.url, "memory://", *jwt_options(str(issuer.jwks_file)))
    line = child.log.read_text()
    assert (
        f"callers by the sub of a bearer JWT verified with the keys of {issuer.jwks_file}" in line
    )
    assert f"issuer {ISSUER}, audience {AUDIENCE}" in line
    assert "a refreshed credential is a new caller" not in line
    assert "only if the upstream authorizes at the transport" in line


@pytest.mark.parametrize("unidentified", ["refuse", "shared"])
async def test_a_forged_token_is_refused_or_relayed_never_shared(
    charging: Upstream, gateways: Callable[..., Child], issuer: Issuer, unidentified: str
) -> None:
    assert issuer.jwks_file is not None
    options = jwt_options(str(issuer.jwks_file), "--unidentified", unidentified)
    url = gateway_url(gateways(charging.url, "memory://", *options))
    statuses = []
    async with httpx.AsyncClient(timeout=30) as client:
        for n in range(2):
            forged = issuer.token("alice", key=new_key())
            message = call(n, "charge", {"amount": 5})
            statuses.append((await post(client, url, message, headers=_bearer(forged))).status)
    if unidentified == "refuse":
        assert statuses == [400, 400]
        assert charging.executions() == []
    else:  # relayed each time: the shared scope is for callers that present no credential
        assert statuses == [200, 200]
        assert charging.executions() == ["refused", "refused"]
