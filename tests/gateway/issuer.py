"""A test OAuth authorization server: keys made here, JWTs minted with them, and a loopback HTTP
server for its JWKS (``/jwks``) and RFC 7662 introspection (``/introspect``).

Nothing leaves 127.0.0.1. The server runs on a thread of the test process; the gateway and
the upstream (subprocesses) reach it by URL, or read the JWKS from a file the issuer writes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ISSUER = "https://issuer.test"
AUDIENCE = "https://gateway.test/mcp"
CLIENT = ("gateway", "gateway-secret")

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def new_key(kind: str = "rsa") -> PrivateKey:
    if kind == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _algorithm(key: PrivateKey) -> str:
    return "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"


def public_jwk(key: PrivateKey, kid: str) -> dict[str, Any]:
    algorithm = jwt.get_algorithm_by_name(_algorithm(key))
    jwk: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": _algorithm(key)}


class Issuer:
    """Signs tokens with its current key; ``rotate()`` replaces the key in its JWKS.

    ``jwks_file`` (when given) always holds the current JWKS; ``revoked`` tokens introspect
    as inactive; ``fetches`` counts the JWKS requests its server answered.
    """

    def __init__(self, jwks_file: Path | None = None, kind: str = "rsa") -> None:
        self.jwks_file = jwks_file
        self.kid = "key-1"
        self.keys: dict[str, PrivateKey] = {self.kid: new_key(kind)}
        self.minted: dict[str, dict[str, Any]] = {}
        self.revoked: set[str] = set()
        self.fetches = 0
        self.introspections = 0
        self._write()

    def jwks(self) -> dict[str, Any]:
        return {"keys": [public_jwk(key, kid) for kid, key in self.keys.items()]}

    def rotate(self, kind: str = "rsa") -> None:
        """A new signing key; the old one leaves the JWKS (its tokens stop verifying)."""
        self.kid = f"key-{len(self.minted) + 2}-{uuid.uuid4().hex[:6]}"
        self.keys = {self.kid: new_key(kind)}
        self._write()

    def _write(self) -> None:
        if self.jwks_file is not None:
            self.jwks_file.write_text(json.dumps(self.jwks()))

    def token(
        self,
        sub: str = "alice",
        *,
        ttl: float = 300,
        key: PrivateKey | None = None,
        kid: str | None = None,
        **claims: Any,
    ) -> str:
        """A fresh JWT for ``sub`` (each call's bytes differ: a new ``jti``, a new ``iat``)."""
        now = time.time()
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": sub,
            "iat": int(now),
            "exp": int(now + ttl),
            "jti": uuid.uuid4().hex,
            **claims,
        }
        signer = key if key is not None else self.keys[self.kid]
        headers = {"kid": kid or self.kid}
        token = jwt.encode(payload, signer, algorithm=_algorithm(signer), headers=headers)
        self.minted[token] = payload
        return token

    def introspect(self, token: str) -> dict[str, Any]:
        claims = self.minted.get(token)
        if claims is None or token in self.revoked or claims["exp"] <= time.time():
            return {"active": False}
        return {"active": True, "client_id": "mcp-client", **claims}


class _Handler(BaseHTTPRequestHandler):
    issuer: Issuer

    def do_GET(self) -> None:
        if self.path != "/jwks":
            self._send(404, {"error": "not found"})
            return
        self.issuer.fetches += 1
        self._send(200, self.issuer.jwks())

    def do_POST(self) -> None:
        expected = base64.b64encode(":".join(CLIENT).encode()).decode()
        if self.headers.get("authorization") != f"Basic {expected}":
            self._send(401, {"error": "invalid_client"})
            return
        length = int(self.headers.get("content-length", "0"))
        form = parse_qs(self.rfile.read(length).decode())
        self.issuer.introspections += 1
        self._send(200, self.issuer.introspect(form.get("token", [""])[0]))

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def serve_issuer(issuer: Issuer) -> Iterator[str]:
    """Serve ``issuer`` on a loopback port; yields its base URL (``/jwks``, ``/introspect``)."""
    handler = type("Handler", (_Handler,), {"issuer": issuer})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
