"""Capped exponential backoff, and the one retry loop every store uses: its constants here.

``retrying(attempt, ...)`` awaits ``attempt()`` until it returns, retrying only the failures
its caller names, at most ``attempts`` times in all and/or until ``within`` seconds have passed,
pausing between tries as its ``Backoff`` says (a pause never runs past the deadline, and a
cancellation lands in it at once). The ``wait`` loop polls with the same ``Backoff`` pauses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

__all__ = [
    "NO_PAUSE",
    "POLL",
    "REDIS_TIMEOUTS",
    "SQLITE_BUSY",
    "Backoff",
    "retrying",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses of ``first`` seconds, doubling after each, never longer than ``cap``."""

    first: float
    cap: float

    def pauses(self) -> Iterator[float]:
        pause = self.first
        while True:
            yield pause
            pause = min(pause * 2, self.cap)


# SQLite: another connection holds the write lock. Each attempt already blocked up to the
# store's BUSY_ATTEMPT inside SQLite; between attempts, sleep in asyncio from 1 ms to 25 ms.
SQLITE_BUSY = Backoff(0.001, 0.025)
# Redis: a reply did not come within socket_timeout. 40 ms, doubling to 0.5 s: what redis-py's
# ExponentialBackoff(base=0.02, cap=0.5) gives (the store hands the driver the same numbers
# for its own retries of connection errors).
REDIS_TIMEOUTS = Backoff(0.04, 0.5)
# DynamoDB's reserve: the item changed between the condition check and the read of it; the
# next try races nothing that a pause would help, so it goes at once.
NO_PAUSE = Backoff(0.0, 0.0)
# The wait loop's polling, when the engine cannot push: look again after 10 ms, doubling up
# to 250 ms between reads.
POLL = Backoff(0.01, 0.25)


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    retry_on: Callable[[Exception], bool],
    backoff: Backoff,
    attempts: int | None = None,
    within: float | None = None,
) -> T:
    """``await attempt()``, tried again while it raises what ``retry_on`` accepts: at most
    ``attempts`` tries in all, and none that would start ``within`` seconds from now. Past
    either limit the last failure is raised as it was."""
    if within is None:
        give_up = None
    else:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + within
    pauses: Iterator[float] | None = None
    tries = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            tries += 1
            if not retry_on(exc) or (attempts is not None and tries >= attempts):
                raise
            if pauses is None:
                pauses = backoff.pauses()
            pause = next(pauses)
            if give_up is not None:
                remaining = give_up - loop.time()
                if remaining <= 0:
                    raise
                pause = min(pause, remaining)
        if pause > 0:
            await asyncio.sleep(pause)
