"""The ASGI wire's types, named once for every module of the HTTP door (ASGI 3.0: a scope, the
receive and send callables, an app), so the middleware and its options need not import each
other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

__all__ = ["ASGIApp", "Message", "Receive", "RoutePredicate", "Scope", "Send"]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]
RoutePredicate: TypeAlias = Callable[[Scope], bool]
"""Whether a request's route requires an ``Idempotency-Key``."""
