"""The one ``wait`` loop: push wake-up where the engine has one, polling with capped backoff
otherwise, every read bounded by what is left of the one deadline.

A backend author composes ``wait_for_holder`` from two pieces of its own:

- ``read``: one look at the record, returning a ``Sighting`` (the live record or None, and the
  time on the clock that decides leases, so a lapsed lease is judged by the same clock);
- ``subscribe`` (engines that can push): opens a ``Subscription`` whose ``event`` is set when
  the key changes and whose ``pushing`` says whether a change after the next read cannot be
  missed. Without one, or while it is not pushing, the loop polls.

What callers may rely on: ``wait`` returns within ``timeout`` plus at most ``READ_FLOOR``
(a read is never given less, so ``timeout=0`` still reads once), whatever the engine's own
command or socket timeouts are. When the first read cannot finish in time nothing is known:
``unavailable`` builds the ``StoreUnavailableError`` raised. When a later read cannot, the
record of the last read that did is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from idemstore.backends.backoff import POLL
from idemstore.protocol import Status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.errors import IdemstoreError
    from idemstore.protocol import Record

__all__ = [
    "PUSH_RECHECK",
    "READ_FLOOR",
    "Sighting",
    "Subscription",
    "settled",
    "wait_for_holder",
]

# Polling pauses between reads: backoff.POLL. With a working push channel, still look again
# this often in case a message was lost.
PUSH_RECHECK = 1.0
# The least time a read inside wait is given, so that wait(timeout=0) ("look once") still gets
# an answer from a busy engine, and a read right at the deadline is not cut off (that costs its
# connection on most drivers: a reply left unread cannot be reused). Short against any command
# or socket timeout, long against a loopback round trip on a loaded machine.
READ_FLOOR = 0.25


@dataclass(frozen=True, slots=True)
class Sighting:
    """One read of a key: its live record (or None) and the lease clock when it was read."""

    record: Record | None
    now: float


class Subscription(Protocol):
    """A push channel on one key for the length of one ``wait``."""

    @property
    def event(self) -> asyncio.Event:
        """Set when the key may have changed (the loop clears it before each read)."""
        ...

    @property
    def pushing(self) -> bool:
        """Whether a change after the next read is certain to set ``event``."""
        ...

    def close(self) -> None:
        """Stop listening for this wait (never raises)."""
        ...


def settled(sighting: Sighting) -> bool:
    """No live lease holds the key: absent, completed, or its lease lapsed."""
    record = sighting.record
    if record is None or record.status is Status.COMPLETED:
        return True
    return record.lease_expires_at is None or record.lease_expires_at <= sighting.now


class _Polling:
    """The subscription of an engine that cannot push: nothing ever sets the event."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = asyncio.Event()

    pushing = False

    def close(self) -> None:
        pass


async def wait_for_holder(
    read: Callable[[], Awaitable[Sighting]],
    *,
    timeout: float,
    unavailable: Callable[[TimeoutError], IdemstoreError],
    subscribe: Callable[[], Awaitable[Subscription]] | None = None,
) -> Record | None:
    """Return once no live lease holds the key, or after ``timeout`` seconds (then the
    current record). ``timeout`` must already be checked (``wait_arguments``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def bounded() -> asyncio.Timeout:
        return asyncio.timeout_at(max(deadline, loop.time() + READ_FLOOR))

    try:
        async with bounded():
            sighting = await read()
    except TimeoutError as exc:
        raise unavailable(exc) from exc
    if settled(sighting) or loop.time() >= deadline:
        return sighting.record
    subscription: Subscription = _Polling()
    if subscribe is not None:
        # Subscribing opens a connection on some engines: it gets no more time than a read.
        with contextlib.suppress(TimeoutError):
            async with bounded():
                subscription = await subscribe()
    try:
        # Subscribed after the first read: read again at once, so a change in between is seen.
        look_now = subscription.pushing
        polls = POLL.pauses()
        while True:
            if not look_now:
                record = sighting.record
                assert record is not None and record.lease_expires_at is not None
                pause = PUSH_RECHECK if subscription.pushing else next(polls)
                # Also wake when the lease lapses: nobody pushes that.
                lapse = record.lease_expires_at - sighting.now + 0.001
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        subscription.event.wait(), min(pause, lapse, deadline - loop.time())
                    )
            look_now = False
            subscription.event.clear()
            try:
                async with bounded():
                    sighting = await read()
            except TimeoutError:
                return sighting.record
            if settled(sighting) or loop.time() >= deadline:
                return sighting.record
    finally:
        subscription.close()
