"""The token verifiers on their own (``idemstore.mcp.caller_tokens``), with injected clocks:
what a token must prove, key rotation and its rate limit, the introspection cache."""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import time
from typing import TYPE_CHECKING, Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from idemstore.callers import Principal
from idemstore.errors import ConfigurationError
from idemstore.mcp.caller_tokens import (
    IntrospectionVerifier,
    JwksKeys,
    JwtVerifier,
    TokenRules,
    add_arguments,
    bearer_token,
    verifier_from_args,
)
from tests.gateway.issuer import AUDIENCE, CLIENT, ISSUER, Issuer, serve_issuer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RULES = TokenRules(issuer=ISSUER, audience=AUDIENCE)
ALICE = Principal("jwt", f"{ISSUER}||alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def issuer(tmp_path: Path) -> Issuer:
    return Issuer(tmp_path / "jwks.json")


@pytest.fixture
def issuer_url(issuer: Issuer) -> Iterator[str]:
    yield from serve_issuer(issuer)


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _file_verifier(issuer: Issuer, rules: TokenRules = RULES) -> JwtVerifier:
    return JwtVerifier(JwksKeys(str(issuer.jwks_file)), rules)


@pytest.mark.parametrize(
    ("value", "token"),
    [
        (None, None),
        ("Bearer", None),
        ("Bearer undefined", None),
        ("bearer   null", None),
        ("Bearer abc.def.ghi", "abc.def.ghi"),
        ("BEARER\tabc", "abc"),
        ("Basic YWxpY2U6cHc=", ""),  # a credential, but no bearer token: unverifiable
        ("Bearer a b", ""),
    ],
)
def test_the_bearer_token_of_a_request(value: str | None, token: str | None) -> None:
    headers = [] if value is None else [("authorization", value)]
    assert bearer_token([("cookie", "consent=1"), *headers]) == token


async def test_a_refreshed_token_names_the_same_principal(issuer: Issuer) -> None:
    verifier = _file_verifier(issuer)
    async with verifier.connected():
        first = await verifier.principal(issuer.token("alice"))
        second = await verifier.principal(issuer.token("alice"))
    assert first == second == ALICE


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": int(time.time()) - 3600},  # expired
        {"aud": "https://another-service.test"},
        {"iss": "https://another-issuer.test"},
        {"sub": ""},
        {"sub": ["alice"]},
    ],
)
async def test_a_token_that_proves_nobody_names_no_principal(
    issuer: Issuer, claims: dict[str, Any]
) -> None:
    verifier = _file_verifier(issuer)
    async with verifier.connected():
        assert await verifier.principal(issuer.token(**claims)) is None


async def test_unsigned_and_hmac_tokens_are_refused_even_keyed_with_the_public_key(
    issuer: Issuer,
) -> None:
    public = issuer.keys[issuer.kid].public_key()
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": int(time.time()) + 60}
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": issuer.kid})
    # Algorithm confusion: HS256 "signed" with the (public) PEM as the shared secret.
    header = {"alg": "HS256", "typ": "JWT", "kid": issuer.kid}
    signing_input = f"{_b64(json.dumps(header))}.{_b64(json.dumps(claims))}"
    mac = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    forged = f"{signing_input}.{_b64(mac)}"
    verifier = _file_verifier(issuer)
    async with verifier.connected():
        assert await verifier.principal(issuer.token("alice")) == ALICE
        assert await verifier.principal(unsigned) is None
        assert await verifier.principal(forged) is None
    with pytest.raises(ConfigurationError, match="HS256"):
        TokenRules(issuer=ISSUER, audience=AUDIENCE, algorithms=("RS256", "HS256"))
    with pytest.raises(ConfigurationError, match="none"):
        TokenRules(issuer=ISSUER, audience=AUDIENCE, algorithms=("none",))


async def test_a_tenant_claim_is_part_of_the_principal(issuer: Issuer) -> None:
    rules = TokenRules(issuer=ISSUER, audience=AUDIENCE, tenant_claim="tid")
    verifier = _file_verifier(issuer, rules)
    async with verifier.connected():
        one = await verifier.principal(issuer.token("alice", tid="acme"))
        other = await verifier.principal(issuer.token("alice", tid="globex"))
        none = await verifier.principal(issuer.token("alice"))
        piped = await verifier.principal(issuer.token("a|b", tid="c"))
        split = await verifier.principal(issuer.token("b", tid="c|a"))
    assert one == Principal("jwt", f"{ISSUER}|acme|alice")
    assert other is not None and other != one
    assert none is None  # a token without its tenant names nobody
    assert piped is not None and split is not None and piped != split


async def test_an_unknown_kid_refetches_the_jwks_at_most_once_per_interval(
    issuer: Issuer, issuer_url: str
) -> None:
    clock = Clock()
    keys = JwksKeys(f"{issuer_url}/jwks", refetch_interval=10, max_age=300, clock=clock)
    verifier = JwtVerifier(keys, RULES)
    async with verifier.connected():
        assert await verifier.principal(issuer.token("alice")) == ALICE
        issuer.rotate(kind="ec")
        rotated = issuer.token("alice")
        assert await verifier.principal(rotated) == ALICE  # refetched for the new kid
        assert issuer.fetches == 2
        made_up = issuer.token("alice", kid="no-such-key")
        for _ in range(5):
            assert await verifier.principal(made_up) is None
        assert issuer.fetches == 2  # the rotation's refetch was this interval's one
        clock.now += 10
        for _ in range(5):
            assert await verifier.principal(made_up) is None
        assert issuer.fetches == 3  # one more in the next interval, then none
        assert await verifier.principal(rotated) == ALICE  # cached: no fetch
        assert issuer.fetches == 3


async def test_a_key_removed_from_the_jwks_stops_verifying_after_max_age(
    issuer: Issuer, issuer_url: str
) -> None:
    clock = Clock()
    keys = JwksKeys(f"{issuer_url}/jwks", refetch_interval=10, max_age=300, clock=clock)
    verifier = JwtVerifier(keys, RULES)
    async with verifier.connected():
        old = issuer.token("alice")
        assert await verifier.principal(old) == ALICE
        issuer.rotate()
        assert await verifier.principal(old) == ALICE  # the cached set still holds it
        clock.now += 300
        assert await verifier.principal(old) is None


def _introspection(issuer_url: str, **kwargs: Any) -> IntrospectionVerifier:
    return IntrospectionVerifier(f"{issuer_url}/introspect", *CLIENT, RULES, **kwargs)


async def test_introspection_names_active_tokens_and_caches_them_briefly(
    issuer: Issuer, issuer_url: str
) -> None:
    clock = Clock()
    verifier = _introspection(issuer_url, cache_seconds=10, clock=clock)
    async with verifier.connected():
        token = issuer.token("alice")
        assert await verifier.principal(token) == ALICE
        issuer.revoked.add(token)
        assert await verifier.principal(token) == ALICE  # within the cache window
        assert issuer.introspections == 1
        clock.now += 10
        assert await verifier.principal(token) is None
        assert await verifier.principal("never-minted") is None


async def test_an_introspection_answer_is_never_cached_past_the_tokens_exp(
    issuer: Issuer, issuer_url: str
) -> None:
    clock, wall = Clock(), Clock()
    wall.now = time.time()
    verifier = _introspection(issuer_url, cache_seconds=60, clock=clock, wall=wall)
    async with verifier.connected():
        token = issuer.token("alice", ttl=30)
        assert await verifier.principal(token) == ALICE
        clock.now += 41
        wall.now += 41  # past exp and the 10 s leeway, well within the 60 s cache window
        assert await verifier.principal(token) is None  # asked again: exp has passed
        assert issuer.introspections == 2


async def test_introspection_checks_issuer_and_audience_only_when_configured(
    issuer: Issuer, issuer_url: str
) -> None:
    url = f"{issuer_url}/introspect"
    anyone = IntrospectionVerifier(url, *CLIENT, TokenRules())
    elsewhere = IntrospectionVerifier(url, *CLIENT, TokenRules(audience="https://other.test"))
    async with anyone.connected(), elsewhere.connected():
        token = issuer.token("alice")
        assert await anyone.principal(token) == ALICE  # the answer's iss is the principal's
        assert await elsewhere.principal(token) is None


async def test_introspection_with_wrong_client_credentials_names_nobody(
    issuer: Issuer, issuer_url: str
) -> None:
    verifier = IntrospectionVerifier(f"{issuer_url}/introspect", "gateway", "wrong", RULES)
    async with verifier.connected():
        assert await verifier.principal(issuer.token("alice")) is None


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "claim", "message"),
    [
        (("--jwks", "x.json"), None, "add --caller jwt:sub"),
        ((), "sub", "--jwks FILE|URL or --introspect URL"),
        (("--jwks", "http://jwks.example/keys"), "sub", "must be an https URL"),
        (("--introspect", "https://as.example/introspect"), "sub", "--introspect-client-id"),
    ],
)
def test_a_verifier_misconfigured_is_one_clear_error(
    argv: tuple[str, ...], claim: str | None, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        verifier_from_args(_args(*argv), claim)


def test_a_jwks_verifier_needs_an_issuer_and_an_audience(issuer: Issuer) -> None:
    with pytest.raises(ConfigurationError, match="--jwt-issuer and --jwt-audience"):
        verifier_from_args(_args("--jwks", str(issuer.jwks_file)), "sub")
