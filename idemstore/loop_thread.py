"""A private event loop in a daemon thread, for the synchronous doors (``idemstore.sync``,
``idemstore.http.wsgi``).

The async stores and the async execution path run on this loop unchanged; a blocking caller
submits a coroutine with ``LoopThread.call`` and waits. The coroutine may hand a callable back
to the blocking caller with ``await in_calling_thread(fn)``: the user's work runs in the
thread that asked for it (its thread-locals, its database connection, its signal handling),
while the loop stays free to heartbeat the lease.

A fork copies the object but not the thread: the first call in a child process starts a new
loop and opens a new store there, and never touches the parent's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from idemstore.backends.startup import check_at_startup
from idemstore.backends.urls import open_store
from idemstore.execution.running_work import current_execution, running

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Awaitable, Callable, Generator, Mapping

    from idemstore.protocol import IdempotencyStore

__all__ = ["LoopOwner", "LoopThread", "in_calling_thread", "loop_over_store"]

T = TypeVar("T")
R = TypeVar("R")


class _OverStore(Protocol):
    @property
    def store(self) -> IdempotencyStore: ...


S = TypeVar("S", bound=_OverStore)

# How long close() waits for the owned resource to close before abandoning the loop.
_CLOSE_TIMEOUT = 10.0


class _Mailbox:
    """One blocking call's inbox: callables the loop asks it to run, then its end."""

    __slots__ = ("inbox",)

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Ask | _Handed | None] = queue.SimpleQueue()


class _Ask:
    __slots__ = ("answer", "execution", "fn", "loop")

    def __init__(self, fn: Callable[[], Any], answer: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.answer = answer
        self.loop = answer.get_loop()
        # The work runs in the caller's thread, but it belongs to the execution the loop holds.
        self.execution = current_execution()


class _Handed:
    """A value a coroutine run by ``LoopThread.stream`` hands to the thread iterating it."""

    __slots__ = ("answer", "loop", "value")

    def __init__(self, value: object, answer: asyncio.Future[Any]) -> None:
        self.value = value
        self.answer = answer
        self.loop = answer.get_loop()

    def taken(self) -> None:
        """The iterating thread asks for the next value: the coroutine goes on."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(_answer, self.answer, None, None)


_MAILBOX: contextvars.ContextVar[_Mailbox | None] = contextvars.ContextVar(
    "idemstore_sync_mailbox", default=None
)


async def in_calling_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in the thread blocked in ``LoopThread.call`` (with ``current_execution()``
    as it is here) and return what it returns or raise what it raises. A ``BaseException``
    that is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) arrives here as a
    cancellation; the blocked caller raises the original once the coroutine has ended."""
    mailbox = _MAILBOX.get()
    if mailbox is None:
        raise RuntimeError("in_calling_thread() is only for coroutines run by LoopThread.call")
    answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    mailbox.inbox.put(_Ask(fn, answer))
    return await answer


async def hand_over(value: object) -> None:
    """Give ``value`` to the thread iterating ``LoopThread.stream``; return once that thread
    asks for the next one (so a slow consumer holds this coroutine back, never the loop)."""
    mailbox = _MAILBOX.get()
    if mailbox is None:
        raise RuntimeError("hand_over() is only for coroutines run by LoopThread.stream")
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    mailbox.inbox.put(_Handed(value, answer))
    await answer


def _answer(answer: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if answer.done():  # the coroutine was cancelled meanwhile (the loop is closing)
        return
    if error is None:
        answer.set_result(value)
    elif isinstance(error, Exception):
        answer.set_exception(error)
    else:
        # asyncio re-raises KeyboardInterrupt and SystemExit out of the loop itself: the
        # coroutine sees a cancellation (a failure of the work), the caller the original.
        answer.cancel()


class _Running(Generic[R]):
    __slots__ = ("loop", "pid", "resource", "thread")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, resource: R
    ) -> None:
        self.loop = loop
        self.thread = thread
        self.resource = resource
        self.pid = os.getpid()


_ALL: weakref.WeakSet[LoopThread[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A lock held by another thread of the parent at the fork would stay held forever here.
    for loop_thread in list(_ALL):
        loop_thread._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class LoopThread(Generic[R]):
    """A daemon thread running an event loop, and a resource opened on it.

    Args:
        open: a coroutine function run on the loop once per process to build the resource
            (a store, a runner over it); its exception propagates from the constructor.
        close: a coroutine function given the resource, run on the loop by ``close()``.
        name: the thread's name.
    """

    __slots__ = ("__weakref__", "_close", "_closed", "_lock", "_name", "_open", "_running")

    def __init__(
        self,
        open: Callable[[], Awaitable[R]],
        close: Callable[[R], Awaitable[object]],
        *,
        name: str = "idemstore-loop",
    ) -> None:
        self._open = open
        self._close = close
        self._name = name
        self._lock = threading.Lock()
        self._closed = False
        self._running: _Running[R] | None = None
        _ALL.add(self)
        self._start()

    @property
    def resource(self) -> R:
        """The resource of this process's loop (a child process opens its own)."""
        return self._current().resource

    def _current(self) -> _Running[R]:
        running_now = self._running
        if running_now is not None and running_now.pid == os.getpid():
            return running_now
        with self._lock:
            if self._closed:
                raise RuntimeError("this idemstore runner is closed")
            running_now = self._running
            if running_now is None or running_now.pid != os.getpid():
                # Forked: the parent's loop thread does not exist here; its connections are
                # the parent's, so they are left alone, neither used nor closed.
                running_now = self._start_locked()
            return running_now

    def _start(self) -> None:
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> _Running[R]:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_serve, args=(loop,), name=self._name, daemon=True)
        thread.start()
        try:
            resource = asyncio.run_coroutine_threadsafe(_awaited(self._open()), loop).result()
        except BaseException:
            _stop(loop, thread)
            raise
        self._running = _Running(loop, thread, resource)
        return self._running

    def call(self, make: Callable[[R], Awaitable[T]]) -> T:
        """Run ``make(resource)`` on the loop and wait for its result, running here whatever
        it hands over with ``in_calling_thread``. An interruption of this thread (such as
        ``KeyboardInterrupt``) cancels the coroutine, which then applies its failure policy.
        """
        streamed = self.stream(make)
        while True:
            try:
                next(streamed)  # a value handed over (hand_over) is not this call's to use
            except StopIteration as ended:
                result: T = ended.value
                return result

    def stream(self, make: Callable[[R], Awaitable[T]]) -> Generator[object, None, T]:
        """``call`` as a generator: it yields each value the coroutine hands over
        (``hand_over``), runs here what it asks (``in_calling_thread``) while it is iterated,
        and returns the coroutine's result (or raises its error). Closing it early (a client
        gone) cancels the coroutine, which then applies its failure policy."""
        current = self._current()
        if threading.current_thread() is current.thread:
            raise RuntimeError(
                "a synchronous idemstore call was made from its own event-loop thread (from"
                " async code it runs): use the async API there"
            )
        mailbox = _Mailbox()
        token = _MAILBOX.set(mailbox)
        try:
            # The task starts in a copy of this context: it finds the mailbox there.
            future = asyncio.run_coroutine_threadsafe(
                _awaited(make(current.resource)), current.loop
            )
        finally:
            _MAILBOX.reset(token)
        future.add_done_callback(lambda _f: mailbox.inbox.put(None))
        interrupted: BaseException | None = None
        try:
            while (ask := mailbox.inbox.get()) is not None:
                if isinstance(ask, _Handed):
                    yield ask.value
                    ask.taken()
                    continue
                error = _run_asked(ask)
                if error is not None and not isinstance(error, Exception):
                    interrupted = error
        except BaseException:
            future.cancel()
            raise
        if interrupted is not None:
            raise interrupted
        return _result(future)

    def submit(self, make: Callable[[R], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Start ``make(resource)`` on the loop, for a caller on another event loop to await
        (``asyncio.wrap_future``); it cannot hand work back with ``in_calling_thread``."""
        current = self._current()
        return asyncio.run_coroutine_threadsafe(_awaited(make(current.resource)), current.loop)

    def close(self) -> None:
        """Close the resource and stop the loop; later calls raise ``RuntimeError``.

        Idempotent. In a forked child whose loop never started, nothing is closed (the
        parent owns those connections).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running_now, self._running = self._running, None
        if running_now is None or running_now.pid != os.getpid():
            return
        try:
            asyncio.run_coroutine_threadsafe(
                _awaited(self._close(running_now.resource)), running_now.loop
            ).result(_CLOSE_TIMEOUT)
        finally:
            _stop(running_now.loop, running_now.thread)


class LoopOwner:
    """What a synchronous door built on a ``LoopThread`` (``self._loop``) offers for its
    lifecycle: ``close()`` and ``with``."""

    __slots__ = ()
    _loop: LoopThread[Any]

    def close(self) -> None:
        """Close the store and stop the loop thread (idempotent); later calls raise
        ``RuntimeError``. Calls still running when it is called may fail."""
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Closed whatever ended the block; an exception propagates.
        self.close()


def _run_asked(ask: _Ask) -> BaseException | None:
    value: Any = None
    error: BaseException | None = None
    try:
        if ask.execution is None:
            value = ask.fn()
        else:
            with running(ask.execution):
                value = ask.fn()
    except BaseException as exc:
        error = exc
    # RuntimeError: the loop is closed, so nobody waits for the answer.
    with contextlib.suppress(RuntimeError):
        ask.loop.call_soon_threadsafe(_answer, ask.answer, value, error)
    return error


def _result(future: concurrent.futures.Future[T]) -> T:
    try:
        return future.result()
    finally:
        del future  # break the reference cycle through the traceback promptly


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        # Whatever is still running (a shielded bookkeeping task) gets its cancellation.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()


def _store_factory(
    store: str | Callable[[], IdempotencyStore], options: Mapping[str, Any] | None
) -> Callable[[], IdempotencyStore]:
    """What builds the store ``loop_over_store`` was given (checked here, before the loop)."""
    if isinstance(store, str):
        url, kwargs = store, dict(options or {})
        return lambda: open_store(url, **kwargs)
    if callable(store):
        if options:
            raise TypeError("store_options are for a store URL, not a store factory")
        return store
    raise TypeError(
        "store must be a store URL or a zero-argument callable returning a store (so it is"
        f" built on the synchronous door's own event loop), not {type(store).__name__}"
    )


def loop_over_store(
    store: str | Callable[[], IdempotencyStore],
    store_options: Mapping[str, Any] | None,
    make: Callable[[IdempotencyStore], S],
    *,
    name: str,
) -> LoopThread[S]:
    """A ``LoopThread`` whose resource is ``make(opened)`` over the connected store a
    synchronous door was given: a URL (with ``open_store`` options) or a factory, called on
    the loop so that the driver binds to it, once per process. The store is closed again if
    ``make`` refuses its options; ``close()`` closes it."""
    build = _store_factory(store, store_options)

    async def open_resource() -> S:
        store = build()
        try:
            await store.__aenter__()
            await check_at_startup(store, door=name)  # a missing schema fails the start
            return make(store)
        except BaseException:
            await store.close()
            raise

    async def close_resource(resource: S) -> None:
        await resource.store.close()

    return LoopThread(open_resource, close_resource, name=name)
