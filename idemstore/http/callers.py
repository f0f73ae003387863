"""Who is calling, at the HTTP doors: ``idemstore.callers``' rule with the doors' principals.

Every HTTP door (``idemstore.http.asgi``, ``idemstore.http.wsgi``, ``idemstore.http.django``,
``idemstore.http.fastapi``) takes the same two options and answers the same way:

- ``caller``: a callable given the door's request (the ASGI scope, the WSGI environ, the
  Django request; may be async at the ASGI door) returning a ``Principal``, a string (the
  subject of a ``Principal`` in the realm ``app``) or ``None``. It is asked first; ``None``
  falls through to the door's own principal (``scope["user"]``, ``request.user``,
  ``REMOTE_USER`` when configured), then to ``caller_sources``. A constant (``lambda _:
  "public"``) shares keys between all callers, on purpose.
- ``caller_sources``: the named credentials that tell callers apart when no principal does
  (``CallerSources``: default ``Authorization`` and ``Proxy-Authorization``; ``None``: none,
  a principal is then required).

No principal and no credential: the door answers 400, never a shared scope. Scopes of every
HTTP door live in one namespace, ``http``: an ASGI and a WSGI deployment of one API sharing a
store match each other's records, and a principal's realm keeps kinds of identity apart.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from idemstore.callers import (
    DEFAULT_SOURCES,
    CallerSources,
    Principal,
    caller_sources_of,
    describe_caller_rule,
    principal_of,
    scope_of_caller,
)
from idemstore.errors import ConfigurationError

__all__ = [
    "NAMESPACE",
    "CallerFunction",
    "CallerRule",
    "user_principal",
]

logger = logging.getLogger("idemstore.http")

NAMESPACE = "http"

CallerFunction = Callable[[Any], "Principal | str | Awaitable[Principal | str | None] | None"]


def user_principal(user: object, realm: str, attribute: str) -> Principal | None:
    """The principal of an authenticated user object by ``attribute`` (``identity``, ``pk``),
    or ``None``: not authenticated, or without a usable value there (never its display name).
    A user class that does not implement the attribute (Starlette's ``BaseUser`` raises
    ``NotImplementedError``) names nobody rather than failing the request."""
    if user is None:
        return None
    try:
        if not getattr(user, "is_authenticated", False):
            return None
        subject = getattr(user, attribute, None)
    except (AttributeError, NotImplementedError):
        return None
    return Principal.of(realm, subject)


class CallerRule:
    """One door's caller rule: its ``caller`` callable, the principal the door reads itself
    (``door``, given the same request), and its ``caller_sources``.

    Args:
        caller: the ``caller=`` option, or ``None``.
        sources: the ``caller_sources=`` option (default ``DEFAULT_SOURCES``).
        door: what the door calls its own principal, for the startup log line
            (``scope["user"].identity``); ``None`` when it reads none.
    """

    __slots__ = ("_caller", "door", "sources")

    def __init__(
        self,
        caller: CallerFunction | None = None,
        sources: Iterable[str] | CallerSources | None = DEFAULT_SOURCES,
        *,
        door: str | None = None,
    ) -> None:
        if caller is not None and not callable(caller):
            raise ConfigurationError(
                f"caller must be a callable given the request, returning a Principal, a str or"
                f" None: not {caller!r}"
            )
        self._caller = caller
        self.sources = caller_sources_of(sources)
        self.door = door

    def __str__(self) -> str:
        principals = ["the caller= callable"] if self._caller is not None else []
        if self.door:
            principals.append(self.door)
        return describe_caller_rule(", else ".join(principals) or None, self.sources)

    def log(self) -> None:
        """Say once, at start-up, how this door tells callers apart."""
        if self.sources is not None:
            logger.info("idempotency keys: %s", self)

    def principal(self, request: object) -> Principal | None:
        """What the ``caller=`` callable returns for ``request``, as a principal (sync)."""
        if self._caller is None:
            return None
        returned = self._caller(request)
        if inspect.isawaitable(returned):
            raise TypeError("this door's caller callable must not be async")
        return principal_of(returned)

    async def aprincipal(self, request: object) -> Principal | None:
        """As ``principal``, awaiting a callable that is async."""
        if self._caller is None:
            return None
        returned = self._caller(request)
        if inspect.isawaitable(returned):
            returned = await returned
        return principal_of(returned)

    def scope(
        self, principal: Principal | None, headers: Iterable[tuple[str, str]], query: str
    ) -> str | None:
        """The record scope: ``principal``, else the named credentials, else ``None``."""
        return scope_of_caller(NAMESPACE, principal, self.sources, headers, query)
