"""Lease rules under a skewed client clock, on the backends whose clients decide time.

SQLite and DynamoDB compute and compare deadlines with the client's clock (SEMANTICS.md
section 4). Two stores share one file or table; each has an injected clock, the *taker*'s
reading ``skew`` seconds more than the *owner*'s. The documented margin is the DynamoDB store's
``clock_skew`` (0.1 s by default) and zero for SQLite, whose processes share one host clock.

Within the margin (hypothesis over skew, lease length, retention and when the taker tries):
the taker never takes over a lease that is live by the owner's clock, never treats a completed
record as expired before its retention ends by the writer's clock, takes a lapsed lease over
once the margin has passed, and the stale owner is then fenced out of complete, extend and
release.

Beyond the margin the guarantee breaks, and the last tests pin down by how much: a taker
ahead by ``skew > margin`` takes a live lease over (and re-executes a completed key)
``skew - margin`` seconds early by the owner's clock. Fencing still holds: the stale owner's
complete is refused, so exactly one outcome is stored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from idemstore import Outcome, Status, open_store
from idemstore.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow

# Float deadlines near 1.7e9 s are exact to about 2.4e-7 s: probes stay this far from a bound.
EPS = 1e-3


@dataclass(frozen=True)
class Pair:
    """The owner reads ``clock``; the taker reads ``taker_clock``, ``taker_clock.offset``
    (the skew) seconds ahead. Tests move ``clock.now`` by hand."""

    owner: IdempotencyStore
    taker: IdempotencyStore
    clock: FakeClock
    taker_clock: FakeClock
    margin: float


# backend id -> (URL fixture, documented margin in seconds, extra store options)
BACKENDS: dict[str, tuple[str, float, dict[str, Any]]] = {
    "sqlite-file": ("sqlite_file_store_url", 0.0, {}),
    "dynamodb": ("dynamodb_store_url", 0.1, {}),
    "dynamodb-clock_skew=2": ("dynamodb_store_url", 2.0, {"clock_skew": 2.0}),
}


@pytest.fixture(params=sorted(BACKENDS))
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """Two stores on one file or table, with the owner's and the taker's clocks."""
    fixture, margin, options = BACKENDS[request.param]
    url = request.getfixturevalue(fixture)
    clock = FakeClock(time.time())
    taker_clock = clock.skewed()
    async with (
        open_store(url, clock=clock, **options) as owner,
        open_store(url, clock=taker_clock, **options) as taker,
    ):
        yield Pair(owner, taker, clock, taker_clock, margin)


def _key() -> str:
    return f"k-{uuid.uuid4().hex}"


CLOCK_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@CLOCK_SETTINGS
@given(
    skew_share=st.floats(min_value=-1.0, max_value=0.99),
    behind=st.floats(min_value=0.0, max_value=5.0),
    ttl=st.floats(min_value=0.5, max_value=120.0),
    probe=st.floats(min_value=0.0, max_value=1.0),
)
async def test_within_the_margin_no_live_lease_is_taken_and_the_stale_owner_is_fenced_out(
    pair: Pair, skew_share: float, behind: float, ttl: float, probe: float
) -> None:
    clock, taker_clock = pair.clock, pair.taker_clock
    # Ahead by at most 99% of the margin (SQLite: not at all), or behind by up to 5 s.
    taker_clock.offset = skew_share * (pair.margin if skew_share > 0 else behind)
    event(f"taker {'ahead' if taker_clock.offset > 0 else 'behind or level'}")
    key = _key()
    start = clock.now
    first = await pair.owner.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    lease = first.lease
    assert lease is not None
    # Any time the lease is live by the owner's clock: the taker must find it in progress.
    clock.now = start + min(probe * ttl, ttl - EPS)
    early = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert early.outcome is Outcome.IN_PROGRESS, (taker_clock.offset, clock.now - start, ttl)
    # Once the lease has lapsed by the taker's clock, with the margin: a takeover.
    clock.now = start + ttl + pair.margin - taker_clock.offset + EPS
    taken = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert taken.outcome is Outcome.ACQUIRED and taken.takeover is True
    assert taken.lease is not None and taken.lease.fence == lease.fence + 1
    # The stale owner is fenced out whatever its own clock says.
    assert await pair.owner.extend(lease, lease_ttl=ttl) is None
    assert await pair.owner.complete(lease, b"stale") is False
    assert await pair.owner.release(lease) is False
    assert await pair.taker.complete(taken.lease, b"taker") is True
    record = await pair.owner.get(key)
    assert record is not None
    assert (record.status, record.response, record.fence) == (
        Status.COMPLETED,
        b"taker",
        lease.fence + 1,
    )


@CLOCK_SETTINGS
@given(
    skew_share=st.floats(min_value=-1.0, max_value=0.99),
    retention=st.floats(min_value=1.0, max_value=86400.0),
    probe=st.floats(min_value=0.0, max_value=1.0),
)
async def test_within_the_margin_a_completed_record_replays_until_its_retention_ends(
    pair: Pair, skew_share: float, retention: float, probe: float
) -> None:
    clock, taker_clock = pair.clock, pair.taker_clock
    taker_clock.offset = skew_share * pair.margin if skew_share > 0 else skew_share * 5
    key = _key()
    start = clock.now
    first = await pair.owner.reserve(key, "fp", lease_ttl=30, retention=retention)
    assert first.lease is not None
    assert await pair.owner.complete(first.lease, b"done") is True
    # Any time before the retention ends by the writer's clock: a replay, never a new run.
    clock.now = start + min(probe * retention, retention - EPS)
    again = await pair.taker.reserve(key, "fp", lease_ttl=30, retention=retention)
    assert again.outcome is Outcome.COMPLETED, (taker_clock.offset, clock.now - start, retention)
    assert again.record is not None and again.record.response == b"done"


async def test_within_the_margin_the_owner_keeps_its_lease_by_extending_it(pair: Pair) -> None:
    """A heartbeat by the owner's clock keeps a taker (ahead by 99% of the margin) out."""
    clock, taker_clock = pair.clock, pair.taker_clock
    taker_clock.offset = 0.99 * pair.margin
    key = _key()
    first = await pair.owner.reserve(key, "fp", lease_ttl=3, retention=3600)
    lease = first.lease
    assert lease is not None
    for _ in range(10):
        clock.now += 1  # a beat every third of the lease
        extended = await pair.owner.extend(lease, lease_ttl=3)
        assert extended is not None
        lease = extended
        taker = await pair.taker.reserve(key, "fp", lease_ttl=3, retention=3600)
        assert taker.outcome is Outcome.IN_PROGRESS
    assert await pair.owner.complete(lease, b"owner") is True


# -- beyond the margin: what actually happens -----------------------------------------------


@pytest.mark.parametrize("excess", [0.5, 2.0, 30.0])
async def test_a_taker_ahead_beyond_the_margin_takes_a_live_lease_early_but_is_fenced(
    pair: Pair, excess: float
) -> None:
    """Measured: the takeover comes exactly ``excess`` (= skew - margin) seconds before the
    owner's own clock says its lease ends. Both then run the work; only one outcome is
    stored, because the stale owner fails the token-and-fence check."""
    clock, taker_clock = pair.clock, pair.taker_clock
    taker_clock.offset = pair.margin + excess
    ttl = 60.0
    key = _key()
    start = clock.now
    first = await pair.owner.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    lease = first.lease
    assert lease is not None
    clock.now = start + ttl - excess - EPS
    held = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert held.outcome is Outcome.IN_PROGRESS
    clock.now = start + ttl - excess + EPS
    assert clock.now < lease.lease_expires_at  # live by the owner's clock...
    taken = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert taken.outcome is Outcome.ACQUIRED and taken.takeover is True  # ...yet taken over
    assert taken.lease is not None
    assert await pair.owner.extend(lease, lease_ttl=ttl) is None
    assert await pair.owner.complete(lease, b"stale") is False
    assert await pair.taker.complete(taken.lease, b"taker") is True
    record = await pair.owner.get(key)
    assert record is not None and record.response == b"taker"


@pytest.mark.parametrize("excess", [0.5, 30.0])
async def test_a_taker_ahead_beyond_the_margin_runs_a_completed_key_again_early(
    pair: Pair, excess: float
) -> None:
    """Measured: a completed record counts as expired ``excess`` seconds before its
    retention ends by the writer's clock, so a retry in that window runs the work again."""
    clock, taker_clock = pair.clock, pair.taker_clock
    taker_clock.offset = pair.margin + excess
    retention = 3600.0
    key = _key()
    start = clock.now
    first = await pair.owner.reserve(key, "fp", lease_ttl=30, retention=retention)
    assert first.lease is not None
    assert await pair.owner.complete(first.lease, b"done") is True
    clock.now = start + retention - excess - EPS
    replay = await pair.taker.reserve(key, "fp", lease_ttl=30, retention=retention)
    assert replay.outcome is Outcome.COMPLETED
    clock.now = start + retention - excess + EPS
    assert await pair.owner.get(key) is not None  # the writer still sees its record...
    again = await pair.taker.reserve(key, "fp", lease_ttl=30, retention=retention)
    assert again.outcome is Outcome.ACQUIRED  # ...the skewed client runs it again
    assert again.lease is not None and again.lease.fence == first.lease.fence + 1


@pytest.mark.parametrize("lag", [0.5, 30.0])
async def test_a_taker_behind_takes_a_dead_owners_lease_late(pair: Pair, lag: float) -> None:
    """Measured: a taker whose clock is behind by ``lag`` takes a lapsed lease over
    ``lag + margin`` seconds after the owner's deadline: safe, only later."""
    clock, taker_clock = pair.clock, pair.taker_clock
    taker_clock.offset = -lag
    ttl = 10.0
    key = _key()
    start = clock.now
    first = await pair.owner.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert first.lease is not None
    clock.now = start + ttl + pair.margin + lag - EPS
    still = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert still.outcome is Outcome.IN_PROGRESS
    clock.now = start + ttl + pair.margin + lag + EPS
    taken = await pair.taker.reserve(key, "fp", lease_ttl=ttl, retention=3600)
    assert taken.outcome is Outcome.ACQUIRED and taken.takeover is True
