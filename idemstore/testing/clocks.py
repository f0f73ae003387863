"""A clock a test moves by hand, for every store that takes ``clock=``.

The memory, SQLite and DynamoDB stores decide leases and retention by a ``clock`` callable
(epoch seconds, ``time.time`` by default). Injecting a ``FakeClock`` makes a lapsed lease or an
expired record a matter of one assignment instead of a sleep.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FakeClock"]

# A fixed instant (November 2023): readings are the same on every run.
_START = 1_700_000_000.0


def _zero() -> float:
    return 0.0


class FakeClock:
    """A ``clock=`` for stores: epoch seconds that move only when the test moves them.

    A reading is a base plus ``offset``; the test moves the clock with ``advance(seconds)``
    or by setting ``now`` (or ``offset``). Three kinds, by their base:

    - ``FakeClock(start)``: frozen at ``start`` (a fixed instant by default) until moved;
    - ``FakeClock.ticking()``: the wall clock (``time.time()``) plus the offset, for stores
      that also wait in real time or whose engine expires records by the real date;
    - ``clock.skewed(by)``: another clock's reading plus ``by`` (its ``offset``), for two
      stores whose clocks disagree; it moves with that clock, and the skew can change.

    Example::

        clock = FakeClock()
        store = MemoryStore(clock=clock)
        await store.reserve("k", "fp", lease_ttl=30, retention=3600)
        clock.advance(31)  # the lease lapsed: the next reserve takes the key over

        ahead = clock.skewed(by=0.5)  # another process's clock, half a second ahead
        assert ahead() == clock() + 0.5
    """

    def __init__(self, start: float = _START) -> None:
        self._base: Callable[[], float] = _zero
        self.offset = start

    @classmethod
    def ticking(cls, offset: float = 0.0) -> FakeClock:
        """The wall clock plus ``offset`` seconds (0 at first): real time, moved by hand."""
        clock = cls(offset)
        clock._base = time.time
        return clock

    def skewed(self, by: float = 0.0) -> FakeClock:
        """A clock that reads ``by`` seconds more than this one (``offset`` is the skew)."""
        clock = FakeClock(by)
        clock._base = self
        return clock

    def __call__(self) -> float:
        return self._base() + self.offset

    @property
    def now(self) -> float:
        """The current reading; setting it moves the clock to that reading."""
        return self()

    @now.setter
    def now(self, value: float) -> None:
        # A frozen clock takes the reading as given: no float drift through the offset.
        self.offset = value if self._base is _zero else self.offset + value - self()

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (backward if negative)."""
        self.offset += seconds

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now!r}, offset={self.offset!r})"
