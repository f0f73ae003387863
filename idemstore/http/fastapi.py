"""HTTP ``Idempotency-Key`` for FastAPI, the FastAPI way: the principal comes from a dependency.

FastAPI authenticates in dependencies, which run after every middleware, so a middleware
cannot see who is calling. Here a route declares the key as a dependency that depends on the
app's own authentication::

    from idemstore.http.fastapi import IdempotencyMiddleware, idempotency_key

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, store="redis://localhost:6379/0")

    def caller(user: User = Depends(current_user)) -> str:
        return user.id

    @app.post("/orders", dependencies=[Depends(idempotency_key(caller))])
    async def create_order(order: Order) -> Order: ...

``IdempotencyMiddleware`` is ``idemstore.http.asgi``'s, with the same options, answers and records;
for a keyed request to a route with this dependency it reads the key, the body and the
fingerprint as always, and leaves the reserve to the dependency, which runs once the
principal is known. A replay or a refusal is then answered by the middleware before the
endpoint runs; the endpoint's response is recorded by the middleware as for any keyed request.
The dependency also puts the ``Idempotency-Key`` header in the OpenAPI schema.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any

from idemstore.callers import principal_of
from idemstore.errors import ConfigurationError, MissingDependencyError
from idemstore.http.asgi import KEYED_REQUEST, Answered, KeyedRequest, key_required
from idemstore.http.asgi import IdempotencyMiddleware as ASGIIdempotencyMiddleware
from idemstore.http.options import HEADER_NAME
from idemstore.install_lines import install_hint

try:
    from fastapi import Depends, Header, Request
    from starlette.routing import Match
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.http.fastapi needs FastAPI: " + install_hint("fastapi")
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.http.wire import Scope

__all__ = ["IdempotencyMiddleware", "idempotency_key"]

# What marks the dependency among a route's dependencies.
_MARK = "__idemstore_idempotency_key__"
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_DESCRIPTION = (
    "A unique value per operation (a UUID), sent again unchanged with every retry of it: the"
    " operation runs once and a retry gets the recorded response (Idempotent-Replayed: true)."
)


class IdempotencyMiddleware(ASGIIdempotencyMiddleware):
    """``idemstore.http.asgi.IdempotencyMiddleware`` that lets a route's ``idempotency_key``
    dependency reserve the key, once the app's dependencies know the principal."""

    __slots__ = ()

    def defers(self, scope: Scope) -> bool:
        router = getattr(scope.get("app"), "router", None)
        for route in getattr(router, "routes", ()):
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return _declares_key(route)
        return False


def _declares_key(route: object) -> bool:
    """Whether ``route`` (a FastAPI ``APIRoute``) depends on ``idempotency_key``."""
    pending = [getattr(route, "dependant", None)]
    while pending:
        dependant = pending.pop()
        if dependant is None:
            continue
        if getattr(dependant.call, _MARK, False):
            return True
        pending.extend(dependant.dependencies)
    return False


def idempotency_key(
    caller: Callable[..., Any] | None = None, *, required: bool = False
) -> Callable[..., Awaitable[None]]:
    """A dependency that makes a route idempotent per ``Idempotency-Key``, in ``Depends()``.

    Args:
        caller: a dependency (anything ``Depends`` takes: it may depend on the app's
            authentication) returning the caller: a ``Principal``, a string (realm ``app``)
            or ``None``. ``None`` falls through to the middleware's rule (its ``caller``
            option, ``scope["user"]``, then its ``caller_sources``); without ``caller`` that
            rule decides alone.
        required: refuse a request without the key (400), as the middleware's ``required``.

    The route needs ``idemstore.http.fastapi.IdempotencyMiddleware`` on the app: a keyed request
    without it fails with ``ConfigurationError`` rather than running unprotected.
    """

    async def claim(request: Request, key: str | None, returned: object) -> None:
        keyed: KeyedRequest | None = request.scope.get(KEYED_REQUEST)
        if keyed is None:
            if key is None:
                if required:
                    raise Answered(key_required())
                return
            raise ConfigurationError(
                "a keyed request reached a route with idempotency_key() without"
                " idemstore.http.fastapi.IdempotencyMiddleware in front of it (or one whose methods"
                " leave this one out): add it, app.add_middleware(IdempotencyMiddleware, ...)"
            )
        await keyed.claim(principal_of(returned))

    async def dependency(request: Request, **values: Any) -> None:
        await claim(request, values.get("key"), values.get("returned"))

    # Declared as FastAPI reads it (this module's annotations are strings, and these are not
    # names it could resolve): the request, the caller's dependency, the header.
    key = Annotated[str | None, Header(alias=HEADER_NAME.title(), description=_DESCRIPTION)]
    parameters = [inspect.Parameter("request", _KEYWORD, annotation=Request)]
    if caller is not None:
        returned = Annotated[Any, Depends(caller)]
        parameters.append(inspect.Parameter("returned", _KEYWORD, annotation=returned))
    parameters.append(inspect.Parameter("key", _KEYWORD, annotation=key, default=None))
    dependency.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    setattr(dependency, _MARK, True)
    return dependency
