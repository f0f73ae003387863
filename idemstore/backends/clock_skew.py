"""Whether the clocks a store's leases are measured by agree: the clock-skew check.

Redis and PostgreSQL measure a lease with the engine's clock (``TIME`` in a script,
``clock_timestamp()`` in SQL). Within one node that is one clock, and no skew matters. It
matters when the clock changes under a live lease: a failover to a node whose clock is ahead
(Sentinel's replica, a Cluster replica, a PostgreSQL standby), or a step of the node's clock
(NTP, an operator). A lease then lapses early by the difference, a retry takes the key over
while its owner still works, and the work runs twice; fencing keeps one outcome stored, but
the side effect ran twice. A store cannot stop a clock from moving; it can measure the clocks
it reaches and say so (``clock_skew_policy``): warn, or refuse every call past
``max_clock_skew`` until the clocks agree again.

How: each node's clock is read with one round trip and compared with the client's wall clock
at the round trip's midpoint; the uncertainty is half the round trip. The client is one of
the clocks compared: if every node is within B of the client, any two nodes are within 2B of
each other, which is what a failover between them can shift a lease by. The check runs when
the store connects and then every ``clock_check_interval`` seconds, off the hot path; calls pay
one attribute read for a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from idemstore.backends.store_options import Option, one_of
from idemstore.errors import ConfigurationError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "CLOCK_OPTIONS",
    "ClockReading",
    "ClockSkew",
    "ClockWatch",
    "NodeClock",
    "read_clock",
]

logger = logging.getLogger("idemstore.clock_skew")


def _skew_bound(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def _interval(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{name} must be 0 (only at connect) or more seconds: {value!r}")
    return float(value)


CLOCK_OPTIONS = (
    Option(
        "max_clock_skew",
        float,
        1.0,
        "seconds the clocks the store reaches (each node's and the client's) may differ "
        "before `clock_skew_policy` acts; a lease measured on one node lapses that much early "
        "on another (see [Clocks](../reliability.md#clocks-what-skew-each-engine-tolerates))",
        _skew_bound,
    ),
    Option(
        "clock_skew_policy",
        str,
        "warn",
        "past `max_clock_skew`: `warn` (log once per episode, logger `idemstore.clock_skew`), "
        "`refuse` (every call raises `StoreUnavailableError` until the clocks agree again) or "
        "`allow` (not checked)",
        one_of("warn", "refuse", "allow"),
    ),
    Option(
        "clock_check_interval",
        float,
        60.0,
        "seconds between two clock checks after the one at connect (`0`: only at connect)",
        _interval,
    ),
)


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One node's clock: ``offset`` seconds ahead of the client's (negative: behind), read
    within ``uncertainty`` seconds (half the round trip)."""

    node: str
    offset: float
    uncertainty: float


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """The store's clock-skew metric: the last check's readings, and ``largest``, the largest
    difference between two clocks read (the client's included), less their uncertainties (so
    noise never counts as skew). ``checks``, ``warnings`` and ``refusals`` count since the
    store was built; ``refusing`` says whether calls are refused now."""

    readings: tuple[ClockReading, ...] = ()
    largest: float = 0.0
    checks: int = 0
    warnings: int = 0
    refusals: int = 0
    refusing: bool = False
    unreadable: tuple[str, ...] = ()

    def describe(self) -> str:
        """The readings, for a message: ``node +1.234 s`` each, the client at 0."""
        return ", ".join(
            f"{r.node} {r.offset:+.3f} s (±{r.uncertainty:.3f})" for r in self.readings
        )


NodeClock = tuple[str, "Callable[[], Awaitable[float]]"]
"""A node to read: its name, and a coroutine function returning its clock in epoch seconds."""


async def read_clock(
    node: str, read: Callable[[], Awaitable[float]], wall: Callable[[], float] = time.time
) -> ClockReading:
    """``node``'s clock against the client's, from one round trip."""
    sent = wall()
    server = await read()
    answered = wall()
    return ClockReading(node, server - (sent + answered) / 2, max(answered - sent, 0.0) / 2)


def _largest(readings: tuple[ClockReading, ...]) -> float:
    """The largest difference between two clocks (the client at offset 0, exactly known),
    less what the round trips leave uncertain."""
    points = [(0.0, 0.0), *((r.offset, r.uncertainty) for r in readings)]
    high = max(points)
    low = min(points)
    return max(high[0] - low[0] - high[1] - low[1], 0.0)


class ClockWatch:
    """The check of one store: readings at connect and every ``interval`` seconds, a warning
    or a refusal past ``bound``, and the metric (``skew``)."""

    # (weakly referenced: telemetry's gauge reads the watches of live stores only)
    __slots__ = (
        "__weakref__",
        "_bound",
        "_interval",
        "_policy",
        "_refusal",
        "_task",
        "_told",
        "_where",
        "skew",
    )

    def __init__(self, where: str, *, bound: float, policy: str, interval: float) -> None:
        self._where = where
        self._bound = bound
        self._policy = policy
        self._interval = interval
        self._refusal: str | None = None
        self._told = False
        self._task: asyncio.Task[None] | None = None
        self.skew = ClockSkew()

    @property
    def enabled(self) -> bool:
        return self._policy != "allow"

    def check_calls(self) -> None:
        """Raise ``StoreUnavailableError`` while the clocks are refused (the hot path)."""
        if self._refusal is not None:
            self.skew = _counted(self.skew, refusals=1)
            raise StoreUnavailableError(self._refusal)

    async def check(
        self, nodes: Callable[[], Awaitable[list[NodeClock]]], *, strict_first: bool = False
    ) -> ClockSkew:
        """Read every clock ``nodes`` names now, judge them, and return the metric. A node
        that cannot be read is listed in ``unreadable`` and judged by the others; with
        ``strict_first``, the first node's error is raised instead (it is the server the
        store's calls go to: its connect, at open, is the store's own)."""
        readings: list[ClockReading] = []
        unreadable: list[str] = []
        listed = await nodes()
        # At once, so a node that does not answer costs the check its own timeout, not the
        # sum of every node's.
        results = await asyncio.gather(
            *(read_clock(node, read) for node, read in listed), return_exceptions=True
        )
        for index, ((node, _), result) in enumerate(zip(listed, results, strict=True)):
            if isinstance(result, ClockReading):
                readings.append(result)
                continue
            if not isinstance(result, Exception):
                raise result  # a cancellation
            if strict_first and index == 0:
                raise result
            unreadable.append(f"{node} ({type(result).__name__})")
        self.judge(tuple(readings), tuple(unreadable))
        return self.skew

    def judge(self, readings: tuple[ClockReading, ...], unreadable: tuple[str, ...]) -> None:
        largest = _largest(readings)
        skew = self.skew
        self.skew = ClockSkew(
            readings, largest, skew.checks + 1, skew.warnings, skew.refusals, False, unreadable
        )
        if largest <= self._bound:
            if self._refusal is not None or self._told:
                logger.warning(
                    "%s: the clocks agree again (largest skew %.3f s, max_clock_skew %.3f s)",
                    self._where,
                    largest,
                    self._bound,
                )
            self._refusal = None
            self._told = False
            return
        message = (
            f"{self._where}: the clocks the store reaches differ by {largest:.3f} s, more than "
            f"max_clock_skew ({self._bound:.3f} s): {self.skew.describe()} against the "
            "client's. Leases are measured by the engine's clock, so after a failover or a "
            "clock step a live lease can lapse that much early and its work run twice. "
            "Synchronise the clocks (NTP slewing, not stepping), or raise max_clock_skew and "
            "lease_ttl together"
        )
        if self._policy == "refuse":
            self._refusal = message + " (clock_skew_policy=refuse: calls are refused meanwhile)"
            self.skew = _counted(self.skew, refusing=True)
        if not self._told:
            self._told = True
            self.skew = _counted(self.skew, warnings=1)
            logger.warning("%s", message)

    def start(self, nodes: Callable[[], Awaitable[list[NodeClock]]]) -> None:
        """Check again every ``interval`` seconds, in a task of the running loop."""
        if self._interval and self._task is None and self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._every(nodes))

    async def _every(self, nodes: Callable[[], Awaitable[list[NodeClock]]]) -> None:
        while True:
            await asyncio.sleep(self._interval)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.check(nodes), timeout=self._interval)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _counted(
    skew: ClockSkew, *, warnings: int = 0, refusals: int = 0, refusing: bool | None = None
) -> ClockSkew:
    return ClockSkew(
        skew.readings,
        skew.largest,
        skew.checks,
        skew.warnings + warnings,
        skew.refusals + refusals,
        skew.refusing if refusing is None else refusing,
        skew.unreadable,
    )
