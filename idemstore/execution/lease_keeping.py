"""Keeping a lease alive while work runs, and giving it up whatever happens to the caller.

Part of the execution path (``idemstore.execution``, which re-exports ``LeaseKeeper``): the
heartbeat, and the two pieces of bookkeeping that a cancellation must never cut short.

``LeaseKeeper(store, lease, lease_ttl, *, first_beat=None)``: the heartbeat, for a consumer
that holds a lease of its own. Extends the lease about every third of ``lease_ttl`` from
construction (the first time after ``first_beat`` seconds when that is sooner) until ``await
stop()`` (which returns the latest lease) or until an extend finds it lost (``lapsed``). A
failing beat (lease lost, or the store raised) is reported to the registered observer
(``idemstore.execution.hooks``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from idemstore.errors import LeaseLostError
from idemstore.execution.eager_tasks import start_task
from idemstore.execution.hooks import current_observer
from idemstore.protocol import answers_inline

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from idemstore.execution.hooks import HeartbeatFailure
    from idemstore.protocol import IdempotencyStore, Lease, Reservation

__all__ = [
    "LeaseKeeper",
    "give_up_late_lease",
    "release_quietly",
    "reserve_cancel_safe",
    "shielded",
]

# The execution path's logger: these records are the execution's story.
logger = logging.getLogger("idemstore.execution")

T = TypeVar("T")


class LeaseKeeper:
    """Extends a lease about every third of its length until stopped or until it lapsed.

    ``first_beat`` (seconds) brings the first extension forward, for a lease that was granted
    some time ago.

    A lapsed lease is not necessarily lost: if nobody took the key over, ``complete`` still
    succeeds, and if someone did, ``complete`` and ``release`` are fenced out. So callers always
    try them; ``lapsed`` is only for logging.

    Keep a reference to the keeper for as long as it should beat: until its first beat the
    event loop holds it only weakly, so a keeper nobody refers to is collected and beats no
    more (its lease then lapses, as its owner's would).
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_loop",
        "_ref",
        "_stopping",
        "_store",
        "_task",
        "_timer",
        "_ttl",
        "lapsed",
        "lease",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        lease: Lease,
        lease_ttl: float,
        *,
        first_beat: float | None = None,
    ) -> None:
        self._store = store
        self._ttl = lease_ttl
        self.lease = lease
        self.lapsed = False
        self._stopping = False
        self._loop = loop = asyncio.get_running_loop()
        # A timer, not a sleeping task: most work ends before the first beat is due, and
        # then stopping costs no task at all (this runs once per execution, on the hot path).
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # first_beat: sooner than a third of the lease when part of it is already gone (the
        # reserve's reply was slow to come).
        delay = lease_ttl / 3 if first_beat is None else min(first_beat, lease_ttl / 3)
        # The first beat waits on the loop's one clock (_FirstBeats), not on a timer of its
        # own: most keepers are stopped long before it is due.
        self._clock = _first_beats(loop)
        self._ref = weakref.ref(self)
        if self._clock is None:
            self._timer = loop.call_later(delay, self._due)
        else:
            self._clock.add(loop, self._ref, loop.time() + delay)

    @property
    def idle(self) -> bool:
        """Whether no ``extend`` is in flight: ``stop()`` then returns without suspending."""
        return self._task is None

    @property
    def running(self) -> bool:
        """Whether the heartbeat still runs (not stopped, and the lease not found lost)."""
        return self._clock is not None or self._timer is not None or self._task is not None

    def _wait_until(self, when: float) -> None:
        """Leave the loop's clock for a timer of its own: this keeper outlived a tick."""
        self._clock = None
        self._timer = self._loop.call_at(when, self._due)

    def _due(self) -> None:
        self._clock = None
        self._timer = None
        if not self._stopping:
            self._task = self._loop.create_task(
                self._beat(self._loop.time()), name=f"idemstore-heartbeat:{self.lease.key}"
            )

    async def _beat(self, sent: float) -> None:
        try:
            extended = await self._store.extend(self.lease, lease_ttl=self._ttl)
        except Exception as exc:
            # A store hiccup: keep the lease we have and try on the next beat; if it lapsed
            # meanwhile, complete() is fenced out and says so.
            logger.warning("heartbeat for key %r failed", self.lease.key, exc_info=True)
            self._report("store_error", exc)
            extended = self.lease
        finally:
            self._task = None
        if extended is None:
            self.lapsed = True
            self._report("lease_lost", None)
            return
        self.lease = extended
        # The flag, not only cancel(), ends the beats: a driver may swallow a cancellation
        # that lands as its call completes (redis-py through asyncio.wait_for on Python 3.11,
        # CPython gh-86296), and no beat may follow that call.
        # The next beat counts from when this one was sent, not from its reply: a slow extend
        # must not push every later one back by its own latency (a reply that took longer
        # than a third of the lease sends the next at once).
        if not self._stopping:
            self._timer = self._loop.call_at(sent + self._ttl / 3, self._due)

    def _report(self, failure: HeartbeatFailure, error: Exception | None) -> None:
        observer = current_observer()
        if observer is not None:
            observer.heartbeat_failed(self._store, failure, error)

    async def stop(self) -> Lease:
        """Stop extending; return the latest lease (the one to complete or release)."""
        self._stopping = True
        if self._clock is not None:
            self._clock.remove(self._ref)
            self._clock = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None:
            task.cancel()
            # asyncio.wait, not await: the heartbeat's own CancelledError must not be
            # confused with (and swallow) a cancellation of the caller arriving meanwhile.
            await asyncio.wait([task])
        return self.lease


class _FirstBeats:
    """One timer per event loop for the first beat of every ``LeaseKeeper`` started on it.

    A timer per keeper would be made, pushed on the loop's heap and cancelled on nearly every
    execution, since most work ends well before a third of its lease. Here a keeper costs a
    dict entry; the one timer fires at the earliest first beat among those waiting. Then the
    keepers that are due beat, and those still waiting (they have run a while: few, and long)
    get timers of their own, so that one firing never scans a keeper twice.

    The clock holds its keepers weakly and no loop at all (the loop holds it, through its
    timer): a loop closed with keepers waiting leaves nothing behind here.
    """

    __slots__ = ("__weakref__", "_waiting", "_when")

    def __init__(self) -> None:
        self._waiting: dict[weakref.ref[LeaseKeeper], float] = {}
        self._when = math.inf  # when the pending timer fires; inf: none pending

    def add(
        self, loop: asyncio.AbstractEventLoop, keeper: weakref.ref[LeaseKeeper], when: float
    ) -> None:
        self._waiting[keeper] = when
        if when < self._when:
            # A timer armed for later stays and, firing, sees it is not the one (_fire).
            self._when = when
            loop.call_at(when, self._fire, when)

    def remove(self, keeper: weakref.ref[LeaseKeeper]) -> None:
        # The timer stays: firing with nobody waiting costs less than a cancel per keeper.
        self._waiting.pop(keeper, None)

    def _fire(self, when: float) -> None:
        if when != self._when:
            return  # superseded by a timer for an earlier beat
        self._when = math.inf
        now = asyncio.get_running_loop().time()
        waiting, self._waiting = self._waiting, {}
        for ref, due in waiting.items():
            keeper = ref()
            if keeper is None:
                continue
            if due <= now:
                keeper._due()
            else:
                keeper._wait_until(due)


_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _FirstBeats] = (
    weakref.WeakKeyDictionary()
)


def _first_beats(loop: asyncio.AbstractEventLoop) -> _FirstBeats | None:
    """The loop's clock; ``None`` for a loop that cannot be weakly referenced."""
    global _last
    last_loop, clock = _last
    if last_loop() is loop:
        return clock  # the usual case: one loop, asked once per execution
    try:
        clock = _CLOCKS.get(loop)
        if clock is None:
            clock = _CLOCKS[loop] = _FirstBeats()
        _last = (weakref.ref(loop), clock)
    except TypeError:
        return None
    return clock


def _no_loop() -> None:
    return None


# The loop asked last and its clock (weakly: a closed loop may go).
_last: tuple[Callable[[], object], _FirstBeats | None] = (_no_loop, None)


_SHIELDED: set[asyncio.Task[Any]] = set()


async def shielded(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end even if the caller is cancelled while awaiting it.

    The bookkeeping around a run (complete, release) must not be cut short by a cancellation:
    a half-done release leaves a key locked, a skipped complete lets the work run twice.
    """
    task = start_task(coroutine)
    if task.done():  # an eager task (Python 3.12+) that finished without suspending
        return task.result()
    _SHIELDED.add(task)  # asyncio keeps only weak references to tasks
    task.add_done_callback(_SHIELDED.discard)
    return await asyncio.shield(task)


async def release_quietly(store: IdempotencyStore, lease: Lease) -> None:
    try:
        await store.release(lease)
    except Exception:
        logger.warning("could not release key %r", lease.key, exc_info=True)


async def give_up_late_lease(
    store: IdempotencyStore, reservation: Reservation, lease_ttl: float
) -> LeaseLostError:
    """Give up a lease whose grant came after it could have lapsed (no work was started on
    it); returns the error that tells the caller so."""
    lease = reservation.lease
    assert lease is not None, "only an acquired key is given up"
    logger.warning(
        "reply to reserve key %r came after its lease of %gs could have lapsed;"
        " given up without running",
        lease.key,
        lease_ttl,
    )
    await _give_up(store, reservation)
    return LeaseLostError(
        f"the lease on idempotency key {lease.key!r} could have lapsed before the"
        f" store's reply granting it arrived (lease_ttl={lease_ttl:g}s): the work"
        " was not started and the key was given up; retry",
        key=lease.key,
        scope=lease.scope,
        record=None,
    )


async def reserve_cancel_safe(
    store: IdempotencyStore, reserving: Coroutine[Any, Any, Reservation]
) -> Reservation:
    """Await ``store``'s ``reserving`` call; if the caller is cancelled meanwhile, a lease the
    reserve still acquires is released before the cancellation propagates."""
    if answers_inline(store):
        # Nothing in it suspends, so no cancellation can land between the reserve taking
        # the key and this caller holding its lease: no task to protect it.
        return await reserving
    task = start_task(reserving)
    if task.done():  # an eager task (Python 3.12+) that finished without suspending
        return task.result()
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # The caller is gone, but its reserve may still land (it is on the wire): a lease
        # it acquires belongs to nobody and would lock the key for lease_ttl. Wait for the
        # reserve and give such a lease up before passing the cancellation on.
        await shielded(_release_if_acquired(store, task))
        raise


async def _release_if_acquired(
    store: IdempotencyStore, reserving: asyncio.Future[Reservation]
) -> None:
    await asyncio.wait([reserving])
    if reserving.cancelled() or reserving.exception() is not None:
        return
    reservation = reserving.result()
    if reservation.lease is not None:
        logger.info(
            "gave key %r up: its caller was cancelled while reserving", reservation.lease.key
        )
        await _give_up(store, reservation)


async def _give_up(store: IdempotencyStore, reservation: Reservation) -> None:
    """Release a lease no work ran on; but one taken over with recovery points is left to
    lapse: a release would drop them, and the next owner would run again the steps whose
    effects earlier owners committed."""
    assert reservation.lease is not None
    if not reservation.checkpoints:
        await release_quietly(store, reservation.lease)
