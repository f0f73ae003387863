"""Who is calling, verified: the gateway as an OAuth resource server (``--caller jwt:CLAIM``).

A bearer token's bytes change on every refresh, and anything can be sent as a bearer token, so
its hash is a poor caller: a refreshed token would be a new caller, and a forged, expired or
revoked one is a caller the upstream may turn down in a tool the gateway never sees. With a
verifier the gateway checks the token itself and names the caller by what the token says:
``Principal("jwt", "ISS|TENANT|SUB")`` (``idemstore.callers``), the same for every token the
issuer mints for that subject.

Two ways to verify, one per gateway:

- ``JwtVerifier``: the token is a JWT whose signature a key of a JWKS (a file, or a URL fetched
  and cached) verifies, with an allowed asymmetric algorithm, the configured issuer and
  audience, and an unexpired ``exp`` (a small leeway for clock skew).
- ``IntrospectionVerifier``: RFC 7662; the authorization server says whether the token is
  ``active`` (and whose it is). Positive answers are cached briefly, never past ``exp``.

A token that fails verification names nobody (``None``): the gateway never replays to it and
never falls back to hashing its bytes. httpx and PyJWT are imported when a verifier is built,
so the command line can declare the flags without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from idemstore.callers import CallerSources, Principal, normalize_field
from idemstore.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    import httpx

__all__ = [
    "ALLOWED_ALGORITHMS",
    "REALM",
    "CallerVerifier",
    "IntrospectionVerifier",
    "JwksKeys",
    "JwtVerifier",
    "TokenRules",
    "add_arguments",
    "bearer_token",
    "verifier_from_args",
]

logger = logging.getLogger("idemstore.mcp.gateway")

REALM = "jwt"
"""The realm of every verified caller: a subject verified here is never a credential hash."""

ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""Signature algorithms a JWKS's public keys verify. ``none`` proves nothing, and an HS*
algorithm would let anyone holding the public key (it is public) sign tokens."""
DEFAULT_ALGORITHMS = ("RS256", "ES256")
DEFAULT_LEEWAY = 10.0
DEFAULT_INTROSPECT_CACHE = 10.0
_TIMEOUT = 5.0
# One Authorization field says who calls: "Bearer TOKEN" (RFC 6750 2.1).
_AUTHORIZATION = CallerSources(("header:authorization",))


def bearer_token(headers: Iterable[tuple[str, str]]) -> str | None:
    """The bearer token of a request: ``None`` when it presents no credential (none, or one
    that names nobody: a bare ``Bearer``, ``Bearer undefined``), ``""`` when it presents one
    that is not a single bearer token (another scheme, two fields): never verifiable."""
    fields = [(name, value) for name, value in headers if name == "authorization"]
    if _AUTHORIZATION.caller(fields) is None:
        return None
    if len(fields) != 1:
        return ""
    scheme, _, token = normalize_field("authorization", fields[0][1]).partition(" ")
    return token if scheme == "bearer" and token and " " not in token else ""


def _escaped(text: str) -> str:
    """``|`` and ``%`` escaped, so the parts of a principal's subject never run together."""
    return text.replace("%", "%25").replace("|", "%7C")


def _part(value: object) -> str | None:
    """A claim as one part of a principal's subject, or None when it names nobody."""
    principal = Principal.of(REALM, value)
    return None if principal is None else _escaped(principal.subject)


@dataclass(frozen=True, slots=True)
class TokenRules:
    """What a verified token must say, and which of its claims name the caller.

    Attributes:
        claim: the claim naming the subject (``sub``).
        issuer: the ``iss`` every token must carry (required for JWTs).
        audience: the ``aud`` a token must include (this gateway's resource identifier).
        tenant_claim: a claim that is part of the principal (``tid``, ``org_id``); a token
            without it names nobody.
        algorithms: the JWT signature algorithms accepted (asymmetric only).
        leeway: seconds of clock skew allowed on ``exp`` and ``nbf``.
    """

    claim: str = "sub"
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway: float = DEFAULT_LEEWAY

    def __post_init__(self) -> None:
        refused = sorted(set(self.algorithms) - ALLOWED_ALGORITHMS)
        if refused or not self.algorithms:
            raise ConfigurationError(
                f"--jwt-algorithms: {', '.join(refused) or 'none given'} cannot be verified"
                f" with a public key; use any of {', '.join(sorted(ALLOWED_ALGORITHMS))}"
            )
        if not self.claim or self.leeway < 0:
            raise ConfigurationError("name the subject claim (jwt:sub) and a leeway of 0 or more")

    def principal(self, claims: Mapping[str, Any], issuer: object) -> Principal | None:
        """The caller ``claims`` name (``issuer``: the token's issuer, ``""`` when an
        introspection answer names none and none is configured), or ``None``."""
        tenant = _part(claims.get(self.tenant_claim)) if self.tenant_claim else ""
        subject = _part(claims.get(self.claim))
        if not isinstance(issuer, str) or tenant is None or subject is None:
            return None
        return Principal(REALM, f"{_escaped(issuer)}|{tenant}|{subject}")

    def describe(self) -> str:
        tenant = f", tenant from {self.tenant_claim}" if self.tenant_claim else ""
        issuer = f"issuer {self.issuer}, " if self.issuer else ""
        audience = f"audience {self.audience}" if self.audience else "any audience"
        return f"{issuer}{audience}{tenant}, leeway {self.leeway:g}s"


class CallerVerifier(Protocol):
    """Turns a bearer token into the caller it proves, or ``None``."""

    async def principal(self, token: str) -> Principal | None:
        """The verified caller of ``token``; ``None`` when it proves nobody."""
        ...

    def connected(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Open what verification fetches with (the gateway's lifespan holds it open)."""
        ...

    def describe(self) -> str:
        """How callers are verified, for the startup line."""
        ...


def _import_jwt() -> Any:
    try:
        import jwt
    except ImportError as exc:
        raise MissingDependencyError.needing(
            "verified callers (--caller jwt:CLAIM)", "PyJWT and cryptography", exc, "gateway"
        ) from None
    return jwt


def _checked_url(url: str, flag: str) -> str:
    """An https URL, or http to a loopback host: keys and secrets never cross a network in
    the clear (a JWKS fetched over plain HTTP could be anyone's keys)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if (parts.scheme == "https" and host) or (parts.scheme == "http" and loopback):
        return url
    raise ConfigurationError(f"{flag} must be an https URL (http only to a loopback host): {url}")


@contextlib.asynccontextmanager
async def _http_client(owner: _Fetching) -> AsyncIterator[None]:
    import httpx

    async with httpx.AsyncClient(timeout=_TIMEOUT, trust_env=False) as client:
        owner.client = client
        try:
            yield
        finally:
            owner.client = None


class _Fetching:
    """What a verifier that fetches over HTTP holds: its client, open under ``connected``."""

    client: httpx.AsyncClient | None = None

    def connected(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return _http_client(self)

    def _open_client(self) -> httpx.AsyncClient:
        if self.client is None:
            raise RuntimeError("the verifier is not connected: run it under the gateway")
        return self.client


class JwksKeys(_Fetching):
    """The signing keys of a JWKS file or URL, cached.

    The set is read again when it is older than ``max_age`` seconds (keys removed from it stop
    verifying), and when a token names a ``kid`` the set does not hold (a rotation): that
    refetch happens at most once per ``refetch_interval`` seconds, so tokens with made-up
    ``kid`` values cannot make the gateway hammer the issuer. ``clock`` is injectable.
    """

    def __init__(
        self,
        source: str,
        *,
        max_age: float = 300.0,
        refetch_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self._url = source.startswith(("http://", "https://"))
        if self._url:
            _checked_url(source, "--jwks")
        elif not Path(source).is_file():
            raise ConfigurationError(f"--jwks: no JWKS file at {source!r} (a path or a URL)")
        self.max_age = max_age
        self.refetch_interval = refetch_interval
        self._clock = clock
        self._keys: list[dict[str, Any]] = []
        self._parsed: dict[tuple[int, str], Any] = {}  # (index in _keys, alg): jwt.PyJWK
        self._read_at: float | None = None
        self._refetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.reads = 0

    def connected(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return _http_client(self) if self._url else contextlib.nullcontext()

    async def key(self, kid: object, algorithm: str) -> Any:
        """The ``jwt.PyJWK`` that verifies a token with header ``kid`` and ``alg``, or None."""
        async with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.max_age:
                await self._read(now)
            index = self._find(kid)
            if index is None and (
                self._refetched_at is None or now - self._refetched_at >= self.refetch_interval
            ):
                self._refetched_at = now
                await self._read(now)
                index = self._find(kid)
            if index is None or self._keys[index].get("alg", algorithm) != algorithm:
                return None
            if (index, algorithm) not in self._parsed:
                self._parsed[index, algorithm] = _parsed_key(self._keys[index], algorithm)
            return self._parsed[index, algorithm]

    def _find(self, kid: object) -> int | None:
        if kid is None:
            return 0 if len(self._keys) == 1 else None
        return next((i for i, k in enumerate(self._keys) if k.get("kid") == kid), None)

    async def _read(self, now: float) -> None:
        self._read_at = now  # a failed read is not retried on every request either
        self.reads += 1
        try:
            if self._url:
                response = await self._open_client().get(self.source)
                response.raise_for_status()
                document = response.json()
            else:
                text = await asyncio.to_thread(Path(self.source).read_text, encoding="utf-8")
                document = json.loads(text)
        except Exception as exc:  # keep the keys we had: the issuer may be briefly away
            logger.warning("JWKS %s not read: %s: %s", self.source, type(exc).__name__, exc)
            return
        keys = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(keys, list):
            logger.warning("JWKS %s has no 'keys' list; keeping the keys it had", self.source)
            return
        # Public signing keys only: a symmetric ("oct") key would turn verification into a
        # shared secret anyone who reads the JWKS holds.
        self._keys = [
            k
            for k in keys
            if isinstance(k, dict) and k.get("kty") != "oct" and k.get("use", "sig") == "sig"
        ]
        self._parsed.clear()


def _parsed_key(jwk: dict[str, Any], algorithm: str) -> Any:
    """``jwk`` as a ``jwt.PyJWK`` bound to ``algorithm``; ``None`` when it is no key for it
    (an EC key for RS256, say)."""
    jwt = _import_jwt()
    try:
        return jwt.PyJWK(jwk, algorithm=algorithm)
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        return None


class JwtVerifier:
    """Verifies a JWT locally against ``keys`` by ``rules`` (issuer and audience required)."""

    def __init__(self, keys: JwksKeys, rules: TokenRules) -> None:
        if not rules.issuer or not rules.audience:
            raise ConfigurationError(
                "--jwks needs --jwt-issuer and --jwt-audience: a token signed by the right key"
                " for another audience (another service) must not name a caller here"
            )
        self._jwt = _import_jwt()
        self.keys = keys
        self.rules = rules

    def connected(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.keys.connected()

    async def principal(self, token: str) -> Principal | None:
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return None
        algorithm = header.get("alg")
        if algorithm not in self.rules.algorithms:
            return None
        key = await self.keys.key(header.get("kid"), algorithm)
        if key is None:
            return None
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.rules.audience,
                issuer=self.rules.issuer,
                leeway=self.rules.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError:
            return None
        return self.rules.principal(claims, claims.get("iss"))

    def describe(self) -> str:
        algorithms = " ".join(self.rules.algorithms)
        return (
            f"the {self.rules.claim} of a bearer JWT verified with the keys of {self.keys.source}"
            f" ({algorithms}; {self.rules.describe()})"
        )


class IntrospectionVerifier(_Fetching):
    """Asks an RFC 7662 introspection endpoint whether a token is active, as ``client_id``.

    A positive answer is cached for ``cache_seconds`` (never past the token's ``exp``), so a
    revoked token is refused within that time; negative answers and failures are not cached.
    Only a SHA-256 of each token is kept. ``clock`` and ``wall`` are injectable.
    """

    def __init__(
        self,
        url: str,
        client_id: str,
        client_secret: str,
        rules: TokenRules,
        *,
        cache_seconds: float = DEFAULT_INTROSPECT_CACHE,
        max_cached: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not client_id or not client_secret:
            raise ConfigurationError(
                "--introspect needs --introspect-client-id and --introspect-client-secret"
                " (better: IDEMSTORE_GATEWAY_INTROSPECT_CLIENT_SECRET in the environment)"
            )
        if not cache_seconds >= 0:
            raise ConfigurationError(f"--introspect-cache is 0 or more seconds: {cache_seconds}")
        self.url = _checked_url(url, "--introspect")
        self._auth = (client_id, client_secret)
        self.rules = rules
        self.cache_seconds = cache_seconds
        self._max_cached = max_cached
        self._clock = clock
        self._wall = wall
        self._cache: OrderedDict[str, tuple[float, Principal]] = OrderedDict()

    async def principal(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        self._cache.pop(digest, None)
        answer = await self._ask(token)
        if answer is None or answer.get("active") is not True:
            return None
        rules = self.rules
        issuer = answer.get("iss", rules.issuer)
        audience = answer.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        exp = answer.get("exp")
        left = float(exp) - self._wall() if isinstance(exp, (int, float)) else None
        if (
            (rules.issuer is not None and issuer != rules.issuer)
            or (rules.audience is not None and rules.audience not in audiences)
            or (left is not None and left + rules.leeway <= 0)
        ):
            return None
        principal = rules.principal(answer, "" if issuer is None else issuer)
        if principal is not None and self.cache_seconds > 0:
            keep = self.cache_seconds if left is None else min(self.cache_seconds, left)
            self._cache[digest] = (now + keep, principal)
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        return principal

    async def _ask(self, token: str) -> dict[str, Any] | None:
        import httpx

        try:
            response = await self._open_client().post(
                self.url,
                data={"token": token, "token_type_hint": "access_token"},
                auth=self._auth,
                headers={"accept": "application/json"},
            )
            answer = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("token introspection failed: %s: %s", type(exc).__name__, exc)
            return None
        if answer is None:
            logger.warning("token introspection answered %s", response.status_code)
        return answer if isinstance(answer, dict) else None

    def describe(self) -> str:
        return (
            f"the {self.rules.claim} of a bearer token {self.url} introspects as active"
            f" (positive answers cached {self.cache_seconds:g}s; {self.rules.describe()})"
        )


def add_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """The flags of a verified caller (``--caller jwt:CLAIM`` picks it; ``--caller`` itself
    is the gateway's)."""
    parser.add_argument(
        "--jwks",
        metavar="FILE|URL",
        help="with --caller jwt:CLAIM: verify bearer JWTs with these keys (cached; an "
        "unknown kid refetches, at most every 10 s)",
    )
    parser.add_argument("--jwt-issuer", metavar="ISS", help="the iss a token must carry")
    parser.add_argument(
        "--jwt-audience", metavar="AUD", help="the aud a token must include (this gateway's)"
    )
    parser.add_argument(
        "--jwt-tenant-claim", metavar="CLAIM", help="a claim that is part of the caller (tid)"
    )
    parser.add_argument(
        "--jwt-algorithms",
        nargs="+",
        metavar="ALG",
        help=f"accepted signature algorithms (default {' '.join(DEFAULT_ALGORITHMS)}; "
        "never none or HS*)",
    )
    parser.add_argument(
        "--jwt-leeway",
        type=float,
        default=DEFAULT_LEEWAY,
        metavar="SECONDS",
        help=f"clock skew allowed on exp and nbf (default {DEFAULT_LEEWAY:g})",
    )
    parser.add_argument(
        "--introspect",
        metavar="URL",
        help="with --caller jwt:CLAIM: ask this RFC 7662 endpoint instead of --jwks",
    )
    parser.add_argument("--introspect-client-id", metavar="ID", help="the gateway's client id")
    parser.add_argument(
        "--introspect-client-secret",
        metavar="SECRET",
        help="its secret (better in IDEMSTORE_GATEWAY_INTROSPECT_CLIENT_SECRET)",
    )
    parser.add_argument(
        "--introspect-cache",
        type=float,
        default=DEFAULT_INTROSPECT_CACHE,
        metavar="SECONDS",
        help=f"how long an active answer is trusted (default {DEFAULT_INTROSPECT_CACHE:g}; 0: "
        "ask every time; never past exp)",
    )


def verifier_from_args(args: argparse.Namespace, claim: str | None) -> CallerVerifier | None:
    """The verifier the flags describe; ``claim`` is ``CLAIM`` of ``--caller jwt:CLAIM`` (None
    when callers are told apart by credentials, which no verifier flag may then be given)."""
    jwks, introspect = args.jwks, args.introspect
    if claim is None:
        if jwks or introspect:
            raise ConfigurationError("--jwks and --introspect verify callers: add --caller jwt:sub")
        return None
    if bool(jwks) == bool(introspect):
        raise ConfigurationError(
            "--caller jwt:CLAIM verifies tokens with --jwks FILE|URL or --introspect URL (one)"
        )
    rules = TokenRules(
        claim=claim,
        issuer=args.jwt_issuer,
        audience=args.jwt_audience,
        tenant_claim=args.jwt_tenant_claim,
        algorithms=tuple(args.jwt_algorithms or DEFAULT_ALGORITHMS),
        leeway=args.jwt_leeway,
    )
    if jwks:
        return JwtVerifier(JwksKeys(jwks), rules)
    return IntrospectionVerifier(
        introspect,
        args.introspect_client_id or "",
        args.introspect_client_secret or "",
        rules,
        cache_seconds=args.introspect_cache,
    )
