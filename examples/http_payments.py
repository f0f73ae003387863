"""A payments API whose POSTs are safe to retry: the Idempotency-Key header over a shared store.

Run it from a checkout (Starlette comes with the `mcp` or `gateway` extra; uvicorn with
`gateway`), then send it the requests of docs/http.md:

    pip install '.[sqlite,gateway]'
    uvicorn examples.http_payments:app --port 8000

IDEMSTORE_URL picks the store (default: sqlite:///payments-idem.db, in the working directory);
every server process given the same store shares the records. PAYMENT_SECONDS is how long the
fake card network takes to answer (default 1), long enough to send a retry meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    SimpleUser,
)
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from idemstore.http.asgi import IdempotencyMiddleware

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection, Request

# Who may call: a real app checks tokens against its identity provider.
TOKENS = {"alice-token": "alice", "bob-token": "bob"}
PAYMENT_SECONDS = float(os.environ.get("PAYMENT_SECONDS", "1"))
_payment_ids = itertools.count(1)


class BearerTokens(AuthenticationBackend):
    """`Authorization: Bearer TOKEN` names the user; the middleware keeps records per user."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        scheme, _, token = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None  # anonymous: a keyed request from it is refused (400)
        user = TOKENS.get(token.strip())
        if user is None:
            raise AuthenticationError("unknown token")
        return AuthCredentials(["authenticated"]), SimpleUser(user)


def unauthorized(conn: HTTPConnection, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=401)


async def create_payment(payment: dict[str, object]) -> str:
    """The side effect a retry must not repeat: charging the card."""
    await asyncio.sleep(PAYMENT_SECONDS)  # the card network answering
    return f"pay_{next(_payment_ids)}"


async def pay(request: Request) -> JSONResponse:
    payment = await request.json()
    payment_id = await create_payment(payment)
    return JSONResponse({"id": payment_id, **payment}, status_code=201)


app = Starlette(
    routes=[Route("/payments", pay, methods=["POST"])],
    middleware=[
        # Authentication first (outermost), so the idempotency middleware sees the user.
        Middleware(AuthenticationMiddleware, backend=BearerTokens(), on_error=unauthorized),
        Middleware(
            IdempotencyMiddleware,
            store=os.environ.get("IDEMSTORE_URL", "sqlite:///payments-idem.db"),
            required=["/payments"],  # a POST without a key is refused (400)
            retention=86400,
        ),
    ],
)
