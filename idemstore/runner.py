"""The runner: run a piece of work at most once per key over any store.

``Idempotency`` is the execution path of ``idemstore.execution`` with a decorator on top; it
adds no rules of its own.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar

from idemstore.errors import ConfigurationError, InvalidKeyError
from idemstore.execution import ExecutionPolicy, LeaseKeeper, Result
from idemstore.execution import _release_quietly as _release_quietly
from idemstore.hashing import fingerprint as canonical_fingerprint

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.protocol import IdempotencyStore

__all__ = ["Idempotency", "Result"]

logger = logging.getLogger("idemstore.runner")

# Transitional: the MCP proxy still imports these two names from here until it is ported onto
# idemstore.execution (branch consumers-mcp); delete both then.
_Heartbeat = LeaseKeeper

P = ParamSpec("P")
T = TypeVar("T")


class Idempotency:
    """Execute work at most once per ``(scope, key)``, replaying the stored result to retries.

    Args:
        store: any ``IdempotencyStore``.
        lease_ttl: seconds a caller holds a key without a heartbeat; heartbeats extend it.
        retention: seconds a completed result is replayed.
        in_flight: ``"wait"`` for a running original and return its result, or ``"reject"``
            with ``InProgressError`` at once.
        wait_timeout: seconds to wait for a running original (``None``: without limit).
        on_failure: ``"release"`` the key when the work raises (a retry runs it again) or
            ``"hold"`` it until the lease lapses (never risk a second run in that window).
            A cancellation of the caller while the work runs is a failure too.
    """

    __slots__ = ("_policy",)

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        lease_ttl: float = 30.0,
        retention: float = 86400.0,
        in_flight: Literal["wait", "reject"] = "wait",
        wait_timeout: float | None = None,
        on_failure: Literal["release", "hold"] = "release",
    ) -> None:
        if on_failure not in ("release", "hold"):
            raise ConfigurationError(f"on_failure must be 'release' or 'hold', not {on_failure!r}")
        self._policy = ExecutionPolicy(
            store,
            lease_ttl=lease_ttl,
            retention=retention,
            in_flight=in_flight,
            wait_timeout=wait_timeout,
            on_failure=on_failure,
        )

    @property
    def policy(self) -> ExecutionPolicy:
        """The execution policy this runner applies (``begin`` for finer control)."""
        return self._policy

    @property
    def store(self) -> IdempotencyStore:
        return self._policy.store

    @property
    def lease_ttl(self) -> float:
        return self._policy.lease_ttl

    @property
    def retention(self) -> float:
        return self._policy.retention

    @property
    def in_flight(self) -> Literal["wait", "reject"]:
        return self._policy.in_flight

    @property
    def wait_timeout(self) -> float | None:
        return self._policy.wait_timeout

    @property
    def on_failure(self) -> Literal["release", "hold"]:
        return self._policy.on_failure  # type: ignore[return-value]

    async def run(
        self,
        key: str,
        fingerprint: str,
        work: Callable[[], Awaitable[bytes]],
        *,
        scope: str = "",
    ) -> Result:
        """Run ``work`` unless this key already ran (then replay it) or is running.

        Raises ``ConflictError`` when the key was used with another fingerprint and
        ``InProgressError`` when another caller holds it and the policy is not to wait.
        Whatever ``work`` raises propagates, after the failure policy is applied; a
        cancellation of the caller, at any point, is a failure too (and a ``reserve`` still
        in flight when it lands is released, so no lease is left that nobody owns).
        """
        return await self._policy.run(key, fingerprint, work, scope=scope)

    def idempotent(
        self,
        key: str | Callable[..., str],
        *,
        scope: str | Callable[..., str] = "",
        require_key: bool = False,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """Decorate an async function so each key runs it once and retries get its result.

        ``key`` names the argument that holds the idempotency key, or is a callable given the
        function's arguments that returns it; ``scope`` likewise (a constant string by
        default). The fingerprint covers the function's qualified name and all its bound
        arguments (canonical JSON), and results are stored as JSON, so both must be JSON
        values.

        A key that is ``None`` means "no key": the call runs without deduplication (as a
        request without an ``Idempotency-Key`` does), unless ``require_key`` is true, which
        raises ``InvalidKeyError`` instead. Any other key is used as ``str(key)``.
        """

        def decorate(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            signature = inspect.signature(func)
            if isinstance(key, str) and key not in signature.parameters:
                raise ConfigurationError(f"{func.__qualname__} has no argument named {key!r}")
            name = f"{func.__module__}.{func.__qualname__}"

            @functools.wraps(func)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                arguments = dict(bound.arguments)
                the_key = key(*args, **kwargs) if callable(key) else arguments[key]
                if the_key is None:
                    # str(None) would put every keyless call under the one key "None".
                    if require_key:
                        raise InvalidKeyError(
                            f"{func.__qualname__} was called without an idempotency key"
                            f" ({key if isinstance(key, str) else 'the key'} is None); pass"
                            " one, or drop require_key=True to run such calls without"
                            " deduplication"
                        )
                    return await func(*args, **kwargs)
                the_scope = scope(*args, **kwargs) if callable(scope) else scope
                print_ = canonical_fingerprint({"function": name, "arguments": arguments})

                async def work() -> bytes:
                    return json.dumps(await func(*args, **kwargs)).encode()

                result = await self.run(str(the_key), print_, work, scope=the_scope)
                return json.loads(result.value)  # type: ignore[no-any-return]

            return wrapper

        return decorate
