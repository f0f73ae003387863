"""The synchronous runner: ``idemstore.Idempotency`` for plain functions, threads and processes.

``Idempotency(url)`` opens the store on a private event loop in a daemon thread and runs the
async runner (``idemstore.runner``, so ``idemstore.execution``) there, unchanged: the same
records, the same policies, so a synchronous and an asynchronous caller racing one key run it
once. The work itself runs in the calling thread; the loop heartbeats the lease meanwhile.
Any number of threads may call one runner at once. Each process uses its own loop and store
connections (a runner built before a fork opens new ones in the child on first use).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from idemstore import runner
from idemstore.fingerprint_fields import readable_again
from idemstore.forwarded_options import reject_unknown
from idemstore.loop_thread import LoopOwner, LoopThread, in_calling_thread, loop_over_store

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from idemstore.execution import Result
    from idemstore.protocol import IdempotencyStore
    from idemstore.serializers import Serializer

__all__ = ["Idempotency"]

P = ParamSpec("P")
T = TypeVar("T")


class Idempotency(LoopOwner):
    """Execute plain (``def``) work at most once per ``(scope, key)``; retries get its result.

    Args:
        store: a store URL (``"redis://localhost:6379/0"``, ``"postgresql://..."``), or a
            zero-argument callable returning an ``IdempotencyStore`` (called on the runner's
            loop, once per process, so the driver binds to that loop).
        store_options: engine options for a URL, as ``open_store(url, **store_options)``.

    The other arguments are ``idemstore.Idempotency``'s, with the same meaning and defaults.
    The store is opened, and every option checked, by the constructor (its errors propagate
    from it). Use it as a context manager, or call ``close()``, to close the store and stop
    the loop thread.
    """

    __slots__ = ("_loop", "_serializer")
    _loop: LoopThread[runner.Idempotency]

    def __init__(
        self,
        store: str | Callable[[], IdempotencyStore],
        *,
        store_options: Mapping[str, Any] | None = None,
        serializer: Serializer | None = None,
        **policy: Unpack[runner.PolicyOptions],
    ) -> None:
        def make(opened: IdempotencyStore) -> runner.Idempotency:
            return runner.Idempotency(opened, serializer=serializer, **policy)

        self._loop = loop_over_store(store, store_options, make, name="idemstore-sync")
        self._serializer = self._loop.resource.serializer

    @property
    def serializer(self) -> Serializer:
        return self._serializer

    def run(
        self,
        key: str,
        fingerprint: str,
        work: Callable[[], bytes],
        *,
        scope: str = "",
    ) -> Result:
        """Run ``work`` unless this key already ran (then replay it) or is running.

        ``work`` is a plain zero-argument callable returning the bytes to record; it runs in
        this thread (``current_execution()`` is set while it does). An ``async def`` function
        is refused with ``TypeError`` before anything is reserved: use
        ``idemstore.Idempotency``. Everything else is ``idemstore.Idempotency.run``: the same
        errors, the same failure policy; an interruption (``KeyboardInterrupt``) of the
        work, or of this thread while it waits, counts as a failure.
        """
        _refuse_async(work)

        def called() -> bytes:
            value = work()
            if inspect.iscoroutine(value):
                value.close()  # never awaited: say so once, through the unrecordable path
            return value

        return self._loop.call(
            lambda idem: idem.run(key, fingerprint, lambda: in_calling_thread(called), scope=scope)
        )

    def idempotent(
        self, key: str | Callable[..., str], **options: Unpack[runner.DecoratorOptions]
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorate a plain function so each key runs it once and retries get its result.

        Everything is ``idemstore.Idempotency.idempotent``'s (the key and scope arguments,
        the fingerprint over the function's qualified name and arguments and its
        ``fingerprint_exclude``/``fingerprint_include``, the serializer, ``require_key``),
        so a synchronous and an async function of the same qualified name share records.
        Decorating an ``async def`` function is a ``TypeError``. ``key`` and ``scope``
        callables run in the calling thread (they may read its thread-locals).
        """
        reject_unknown(options, runner.DecoratorOptions, "idempotent()")
        scope = options.get("scope", "")
        # Read again for the runner of a forked child (a generator reads only once).
        forwarded: dict[str, Any] = {name: readable_again(value) for name, value in options.items()}
        # The async decorator runs on the loop thread: callables it is given return what the
        # caller's own thread computed, handed over in the (copied) context of the call.
        async_key = _computed_key if callable(key) else key
        if callable(scope):
            forwarded["scope"] = _computed_scope

        def async_decorator(idem: runner.Idempotency) -> Callable[[Any], Any]:
            return idem.idempotent(async_key, **forwarded)

        def decorate(func: Callable[P, T]) -> Callable[P, T]:
            _refuse_coroutine_function(func)

            # The async decorator sees this stand-in (same name, signature and annotations),
            # so every rule of the decorated call is the async one.
            @functools.wraps(func)
            async def in_caller(*args: P.args, **kwargs: P.kwargs) -> T:
                return await in_calling_thread(functools.partial(func, *args, **kwargs))

            # Decorated now, so that a mistake (no such argument) is found here; again for the
            # runner of a forked child, whose store is its own.
            current = self._loop.resource
            decorated: dict[int, Callable[..., Any]] = {
                id(current): async_decorator(current)(in_caller)
            }

            def decorated_for(idem: runner.Idempotency) -> Callable[..., Any]:
                found = decorated.get(id(idem))
                if found is None:
                    found = decorated[id(idem)] = async_decorator(idem)(in_caller)
                return found

            @functools.wraps(func)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                computed = _COMPUTED.set(
                    (
                        key(*args, **kwargs) if callable(key) else None,
                        scope(*args, **kwargs) if callable(scope) else None,
                    )
                )
                try:
                    return self._loop.call(  # type: ignore[no-any-return]
                        lambda idem: decorated_for(idem)(*args, **kwargs)
                    )
                finally:
                    _COMPUTED.reset(computed)

            return wrapper

        return decorate


_COMPUTED: contextvars.ContextVar[tuple[Any, Any]] = contextvars.ContextVar(
    "idemstore_sync_key_and_scope"
)


def _computed_key(*args: Any, **kwargs: Any) -> Any:
    return _COMPUTED.get()[0]


def _computed_scope(*args: Any, **kwargs: Any) -> Any:
    return _COMPUTED.get()[1]


def _refuse_async(work: object) -> None:
    if not callable(work):
        raise TypeError(f"work must be a callable returning bytes, not {type(work).__name__}")
    target: Any = work
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        raise TypeError(
            f"work {getattr(target, '__qualname__', target)!r} is `async def`: run it with"
            " idemstore.Idempotency (the async runner). Nothing was reserved or run"
        )


def _refuse_coroutine_function(func: Callable[..., Any]) -> None:
    if inspect.iscoroutinefunction(func):
        raise TypeError(
            f"idemstore.sync's @idempotent is for plain functions; {func.__qualname__}"
            " is `async def`: decorate it with idemstore.Idempotency's @idempotent"
        )
