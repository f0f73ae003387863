"""The policy layer: run a piece of work at most once per key over any store."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from idemstore.errors import (
    ConfigurationError,
    ConflictError,
    InProgressError,
    ResponseTooLargeError,
)
from idemstore.hashing import fingerprint as canonical_fingerprint
from idemstore.protocol import Outcome
from idemstore.records import check_duration

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["Idempotency", "Result"]

logger = logging.getLogger("idemstore.runner")

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Result:
    """What ``Idempotency.run`` returns.

    ``replayed`` is true when ``value`` came from the store rather than from running the work;
    ``fence`` is the fence of the execution that produced it.
    """

    value: bytes
    replayed: bool
    fence: int


class _Heartbeat:
    """Extends a lease about every third of its length until stopped or until it lapsed.

    A lapsed lease is not necessarily lost: if nobody took the key over, ``complete`` still
    succeeds, and if someone did, ``complete`` and ``release`` are fenced out. So callers always
    try them; ``lapsed`` is only for logging.
    """

    __slots__ = ("_stopping", "_store", "_task", "_ttl", "lapsed", "lease")

    def __init__(self, store: IdempotencyStore, lease: Lease, ttl: float) -> None:
        self._store = store
        self._ttl = ttl
        self.lease = lease
        self.lapsed = False
        self._stopping = False
        self._task = asyncio.create_task(self._beat(), name=f"idemstore-heartbeat:{lease.key}")

    async def _beat(self) -> None:
        # The flag, not only cancel(), ends the loop: a driver may swallow a cancellation that
        # lands as its call completes (redis-py through asyncio.wait_for on Python 3.11,
        # CPython gh-86296), and the loop must still end after that call.
        while not self._stopping:
            await asyncio.sleep(self._ttl / 3)
            try:
                extended = await self._store.extend(self.lease, lease_ttl=self._ttl)
            except Exception:
                # A store hiccup: keep the lease we have and try on the next beat; if it lapsed
                # meanwhile, complete() is fenced out and says so.
                logger.warning("heartbeat for key %r failed", self.lease.key, exc_info=True)
                continue
            if extended is None:
                self.lapsed = True
                return
            self.lease = extended

    async def stop(self) -> None:
        self._stopping = True
        self._task.cancel()
        # asyncio.wait, not await: the heartbeat's own CancelledError must not be confused
        # with (and swallow) a cancellation of the caller arriving meanwhile.
        await asyncio.wait([self._task])


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
    """

    __slots__ = ("in_flight", "lease_ttl", "on_failure", "retention", "store", "wait_timeout")

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
        if in_flight not in ("wait", "reject"):
            raise ConfigurationError(f"in_flight must be 'wait' or 'reject', not {in_flight!r}")
        if on_failure not in ("release", "hold"):
            raise ConfigurationError(f"on_failure must be 'release' or 'hold', not {on_failure!r}")
        self.store = store
        self.lease_ttl = check_duration("lease_ttl", lease_ttl)
        self.retention = check_duration("retention", retention)
        self.in_flight = in_flight
        self.wait_timeout = (
            None if wait_timeout is None else check_duration("wait_timeout", wait_timeout)
        )
        self.on_failure = on_failure

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
        Whatever ``work`` raises propagates, after the failure policy is applied.
        """
        loop = asyncio.get_running_loop()
        deadline = None if self.wait_timeout is None else loop.time() + self.wait_timeout
        while True:
            reservation = await self.store.reserve(
                key, fingerprint, scope=scope, lease_ttl=self.lease_ttl, retention=self.retention
            )
            outcome = reservation.outcome
            if outcome is Outcome.ACQUIRED:
                assert reservation.lease is not None
                return await self._execute(reservation.lease, work)
            record = reservation.record
            assert record is not None
            if outcome is Outcome.COMPLETED:
                assert record.response is not None
                return Result(record.response, replayed=True, fence=record.fence)
            if outcome is Outcome.MISMATCH:
                raise ConflictError(
                    f"idempotency key {key!r} was already used with different arguments",
                    key=key,
                    scope=scope,
                    record=record,
                )
            remaining = None if deadline is None else deadline - loop.time()
            if self.in_flight == "reject" or (remaining is not None and remaining <= 0):
                raise InProgressError(
                    f"idempotency key {key!r} is being processed by another request",
                    key=key,
                    scope=scope,
                    record=record,
                )
            # The store returns as soon as the holder finishes, gives up, or its lease lapses;
            # then reserve again decides (replay, takeover, or still busy).
            await self.store.wait(
                key, scope=scope, timeout=self.lease_ttl if remaining is None else remaining
            )

    async def _execute(self, lease: Lease, work: Callable[[], Awaitable[bytes]]) -> Result:
        heartbeat = _Heartbeat(self.store, lease, self.lease_ttl)
        try:
            value = await work()
            if not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"work must return bytes, not {type(value).__name__}")
            value = bytes(value)
        except BaseException:
            # Cancellation counts as a failure too: the caller never saw a result.
            await _shielded(self._give_up(heartbeat))
            raise
        # The work is done: record its result even if the caller is cancelled meanwhile; the
        # caller's cancellation still propagates.
        return await _shielded(self._record(heartbeat, lease, value))

    async def _give_up(self, heartbeat: _Heartbeat) -> None:
        await heartbeat.stop()
        if self.on_failure == "release":
            await _release_quietly(self.store, heartbeat.lease)

    async def _record(self, heartbeat: _Heartbeat, lease: Lease, value: bytes) -> Result:
        await heartbeat.stop()
        try:
            stored = await self.store.complete(heartbeat.lease, value)
        except ResponseTooLargeError:
            # The work ran and its caller gets the value; a key left locked would only turn
            # every retry into a wait for the lease to lapse, so give it up at once.
            logger.warning(
                "result for key %r is too large for the store; returned but not recorded",
                lease.key,
            )
            await _release_quietly(self.store, heartbeat.lease)
            return Result(value, replayed=False, fence=lease.fence)
        if not stored:
            logger.warning(
                "lease on key %r (scope %r, fence %d) was lost while the work ran; "
                "its result was returned but not stored",
                lease.key,
                lease.scope,
                lease.fence,
            )
        return Result(value, replayed=False, fence=lease.fence)

    def idempotent(
        self,
        key: str | Callable[..., str],
        *,
        scope: str | Callable[..., str] = "",
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """Decorate an async function so each key runs it once and retries get its result.

        ``key`` names the argument that holds the idempotency key, or is a callable given the
        function's arguments that returns it; ``scope`` likewise (a constant string by
        default). The fingerprint covers the function's qualified name and all its bound
        arguments (canonical JSON), and results are stored as JSON, so both must be JSON
        values.
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
                the_scope = scope(*args, **kwargs) if callable(scope) else scope
                print_ = canonical_fingerprint({"function": name, "arguments": arguments})

                async def work() -> bytes:
                    return json.dumps(await func(*args, **kwargs)).encode()

                result = await self.run(str(the_key), print_, work, scope=the_scope)
                return json.loads(result.value)  # type: ignore[no-any-return]

            return wrapper

        return decorate


_SHIELDED: set[asyncio.Task[Any]] = set()


async def _shielded(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end even if the caller is cancelled while awaiting it.

    The bookkeeping after a run (complete, release) must not be cut short by a cancellation:
    a half-done release leaves a key locked, a skipped complete lets the work run twice.
    """
    task = asyncio.ensure_future(coroutine)
    _SHIELDED.add(task)  # asyncio keeps only weak references to tasks
    task.add_done_callback(_SHIELDED.discard)
    return await asyncio.shield(task)


async def _release_quietly(store: IdempotencyStore, lease: Lease) -> None:
    try:
        # Shielded so a second cancellation of the caller cannot leave the key locked.
        await _shielded(store.release(lease))
    except Exception:
        logger.warning("could not release key %r after a failure", lease.key, exc_info=True)
