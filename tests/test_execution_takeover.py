"""Issue 28: work never starts on a lapsed lease, and a takeover is visible and a policy.

A takeover means the previous holder's outcome is unknown (it may have done the work and died
before recording it): ``on_takeover="run"`` runs again and says so, ``"refuse"`` raises
``OutcomeUnknownError`` and records that, so no retry runs it either.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import (
    ConfigurationError,
    ExecutionPolicy,
    Idempotency,
    LeaseLostError,
    Outcome,
    OutcomeUnknownError,
    current_execution,
    open_store,
)
from idemstore.testing.stores import WrappedStore
from tests.store_at_url import store as store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import Execution, IdempotencyStore, Reservation


def new_key() -> str:
    return f"takeover-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory_store_url", "sqlite_file_store_url", "redis_store_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


@pytest.fixture
async def two_callers(store_url: str) -> AsyncIterator[tuple[IdempotencyStore, IdempotencyStore]]:
    """Two callers of one store: separate connections, except memory:// (one per process)."""
    async with open_store(store_url) as first:
        if store_url.startswith("memory:"):
            yield first, first
            return
        async with open_store(store_url) as second:
            yield first, second


# -- 5: a reserve answered after its lease lapsed ------------------------------------------------


async def test_work_never_starts_on_a_lease_that_lapsed_before_the_reply(
    store: IdempotencyStore,
) -> None:
    class LateStore(WrappedStore):
        """The store under test, whose reserve replies arrive after the lease lapsed."""

        async def reserve(self, *args: Any, **kwargs: Any) -> Reservation:
            reservation = await self.inner.reserve(*args, **kwargs)
            await asyncio.sleep(0.4)  # the paused caller, the slow network
            return reservation

    idem = Idempotency(LateStore(store), lease_ttl=0.3)
    key = new_key()
    runs: list[int] = []

    async def work() -> bytes:
        runs.append(1)
        return b"done"

    with pytest.raises(LeaseLostError) as caught:
        await idem.run(key, "fp", work)
    assert (caught.value.key, caught.value.scope) == (key, "")
    assert runs == []
    # Nothing ran, so the key was given up: the next caller acquires it at once.
    again = await store.reserve(key, "fp", lease_ttl=5, retention=5)
    assert again.outcome is Outcome.ACQUIRED and not again.takeover


# -- 6: takeover is visible ----------------------------------------------------------------------


async def test_a_first_execution_is_no_takeover(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    seen: list[Execution | None] = []

    async def work() -> bytes:
        seen.append(current_execution())
        return b"v"

    result = await idem.run(new_key(), "fp", work)
    (execution,) = seen
    assert execution is not None and execution.fence == result.fence
    assert (execution.takeover, execution.previous_fence) == (False, None)
    assert (result.takeover, result.previous_fence) == (False, None)
    assert current_execution() is None


async def test_a_takeover_after_the_holder_died_runs_and_says_so(
    two_callers: tuple[IdempotencyStore, IdempotencyStore],
) -> None:
    dead_store, store = two_callers
    key = new_key()
    # The first holder reserves, then dies: no heartbeat, no complete.
    dead = await dead_store.reserve(key, "fp", lease_ttl=0.3, retention=60)
    assert dead.lease is not None
    idem = Idempotency(store, lease_ttl=5)
    seen: list[tuple[bool, int | None]] = []

    async def work() -> bytes:
        execution = current_execution()
        assert execution is not None
        seen.append((execution.takeover, execution.previous_fence))
        return b"ran again"

    # The retry waits for the holder (in_flight="wait"), then takes the key over.
    result = await idem.run(key, "fp", work)
    assert seen == [(True, dead.lease.fence)]
    assert (result.takeover, result.previous_fence) == (True, dead.lease.fence)
    assert result.fence > dead.lease.fence
    assert not await dead_store.complete(dead.lease, b"late")


async def test_refuse_on_takeover_raises_outcome_unknown_and_never_runs(
    two_callers: tuple[IdempotencyStore, IdempotencyStore],
) -> None:
    dead_store, store = two_callers
    key = new_key()
    dead = await dead_store.reserve(key, "fp", scope="shop", lease_ttl=0.3, retention=60)
    assert dead.lease is not None
    idem = Idempotency(store, lease_ttl=5, on_takeover="refuse")
    runs: list[int] = []

    async def work() -> bytes:
        runs.append(1)
        return b"must not run"

    with pytest.raises(OutcomeUnknownError) as first:
        await idem.run(key, "fp", work, scope="shop")
    assert (first.value.key, first.value.scope) == (key, "shop")
    assert first.value.previous_fence == dead.lease.fence
    # The key records that its outcome is unknown: every retry is told so at once, even one
    # whose policy would run on a takeover.
    for runner in (idem, Idempotency(store, in_flight="reject")):
        with pytest.raises(OutcomeUnknownError) as retry:
            await runner.run(key, "fp", work, scope="shop")
        assert retry.value.previous_fence == dead.lease.fence
        assert retry.value.record is not None
    assert runs == []
    # The dead holder, back from its pause, is fenced out.
    assert not await dead_store.complete(dead.lease, b"late")


def test_on_takeover_accepts_only_run_or_refuse() -> None:
    store = open_store("memory://")
    with pytest.raises(ConfigurationError, match="on_takeover"):
        ExecutionPolicy(store, on_takeover="wait")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_takeover"):
        Idempotency(store, on_takeover="maybe")  # type: ignore[arg-type]
