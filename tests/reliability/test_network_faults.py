"""Network faults between the store and its engine (``idemstore.testing.FaultProxy`` in front
of PostgreSQL, Redis and, for the single-fault tests, DynamoDB's endpoint): every call ends in
a result or a typed ``IdemstoreError`` within a bound the configured timeouts give, the store
carries on by itself once the network is back, and the history of worker processes running
through the faults still checks out."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import Outcome, Status, StoreUnavailableError, open_store
from idemstore.testing import FaultProxy
from tests.reliability.history import FaultScenario, WorkerConfig, run_history

if TYPE_CHECKING:
    import threading
    from collections.abc import Awaitable, Callable, Iterator
    from pathlib import Path

    from idemstore import IdempotencyStore, Lease

LONG = 60.0
FP = "fp"
# Headroom for a loaded 2-core machine on top of what the timeouts allow: this bounds a hang,
# it is not a latency figure.
SLACK = 2.0


@dataclass(frozen=True)
class Proxied:
    backend: str
    url: str  # the store URL through the proxy, with short timeouts
    direct_url: str
    proxy: FaultProxy
    bound: float  # the longest a call may take: what its timeouts allow, plus SLACK


# Per backend: the fixture of a fresh store URL, the timeout options, and the bound they give.
# Redis: each of retries + 1 attempts waits at most for a connection and a reply, with at most
# 0.5 s of backoff between them. PostgreSQL: a connection (when the pool needs a new one), then
# the statement (asyncpg does not retry). DynamoDB: each of max_attempts waits for a
# connection and a reply, with the SDK's backoff (at most 2 s before the second attempt).
BACKENDS: dict[str, tuple[str, str, float]] = {
    "dynamodb": (
        "dynamodb_store_url",
        "connect_timeout=0.5&read_timeout=0.5&max_attempts=2",
        2 * (0.5 + 0.5) + 2 + SLACK,
    ),
    "postgres": (
        "postgres_store_url",
        "command_timeout=1&connect_timeout=1",
        1 + 1 + SLACK,
    ),
    "redis": (
        "redis_store_url",
        "socket_timeout=0.5&socket_connect_timeout=0.5&retries=1",
        (1 + 1) * (0.5 + 0.5) + 0.5 + SLACK,
    ),
}


@pytest.fixture(params=sorted(BACKENDS))
def proxied(request: pytest.FixtureRequest, seed: int) -> Iterator[Proxied]:
    fixture, options, bound = BACKENDS[request.param]
    direct = request.getfixturevalue(fixture)
    with FaultProxy.for_url(direct, seed=seed) as proxy:
        url = proxy.route(direct) + "&" + options
        yield Proxied(request.param, url, direct, proxy, bound)


def new_key() -> str:
    return f"net-{uuid.uuid4().hex[:12]}"


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    """The call's result or the exception it raised, and how long it took."""
    started = time.monotonic()
    try:
        result: Any = await call()
    except Exception as exc:
        result = exc
    return result, time.monotonic() - started


async def recovered(store: IdempotencyStore, within: float = 20.0) -> float:
    """Seconds until ``store`` answers again (it must, by itself, within ``within``)."""
    started = time.monotonic()
    while True:
        try:
            await store.get(new_key())
            return time.monotonic() - started
        except StoreUnavailableError:
            if time.monotonic() - started > within:
                raise
            await asyncio.sleep(0.05)


async def warm_up(store: IdempotencyStore) -> None:
    """Run every statement once, so the next call is one request on the wire (asyncpg
    prepares a statement in a round trip of its own the first time a connection runs it)."""
    lease = await acquire(store, new_key())
    await store.complete(lease, b"warm")


async def acquire(store: IdempotencyStore, key: str) -> Lease:
    reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert reservation.lease is not None
    return reservation.lease


async def test_added_latency_only_slows_calls_down(proxied: Proxied) -> None:
    async with open_store(proxied.url) as store:
        proxied.proxy.latency = 0.05
        key = new_key()
        lease = await acquire(store, key)
        assert await store.complete(lease, b"slow but done") is True
        record = await store.get(key)
        assert record is not None and record.response == b"slow but done"


async def test_calls_over_a_half_open_connection_fail_typed_within_the_bound(
    proxied: Proxied,
) -> None:
    async with open_store(proxied.url) as store:
        held = await acquire(store, new_key())
        proxied.proxy.hang()
        try:
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "reserve": lambda: store.reserve(new_key(), FP, lease_ttl=LONG, retention=LONG),
                "complete": lambda: store.complete(held, b"never heard"),
                "get": lambda: store.get(new_key()),
                "ping": store.ping,
            }
            for name, call in calls.items():
                result, seconds = await timed(call)
                assert isinstance(result, StoreUnavailableError), (name, result)
                assert seconds < proxied.bound, (name, seconds)
            # wait() polls through outages; it must still end by its own timeout (plus one
            # call's bound), with a record or a typed error.
            result, seconds = await timed(lambda: store.wait(held.key, timeout=1.0))
            assert (
                result is None
                or not isinstance(result, Exception)
                or isinstance(result, StoreUnavailableError)
            ), result
            assert seconds < 1.0 + proxied.bound
        finally:
            proxied.proxy.resume()
        await recovered(store)
        # The complete that timed out may or may not have reached the engine; either way the
        # record is the holder's and the store still works.
        record = await store.get(held.key)
        assert record is not None and record.token == held.token


async def true_or_unavailable(
    proxied: Proxied, store: IdempotencyStore, call: Awaitable[Any]
) -> Any:
    """What ``call`` gave through the fault just set up, once the store answers again: True,
    or ``StoreUnavailableError`` (the outcome is unknown) within the bound; never False, which
    would say nothing was written, nor an untyped error."""
    result, seconds = await timed(lambda: call)
    assert result is True or isinstance(result, StoreUnavailableError), result
    assert seconds < proxied.bound
    await recovered(store)
    return result


async def test_reset_connections_are_typed_errors_and_the_store_carries_on(
    proxied: Proxied,
) -> None:
    async with open_store(proxied.url) as store:
        for _ in range(3):
            key = new_key()
            lease = await acquire(store, key)
            assert proxied.proxy.drop_connections() >= 1
            result = await true_or_unavailable(
                proxied, store, store.complete(lease, b"after a reset")
            )
            record = await store.get(key)
            assert record is not None and record.token == lease.token
            if result is True:
                assert record.response == b"after a reset"


async def test_a_lost_reply_never_turns_a_stored_completion_into_a_refusal(
    proxied: Proxied,
) -> None:
    """The reply to a request was cut: the caller may hear of an error (the outcome is
    unknown) but never False, which says nothing was written."""
    async with open_store(proxied.url) as store:
        for _ in range(3):
            key = new_key()
            await warm_up(store)
            lease = await acquire(store, key)
            proxied.proxy.drop_next_reply()
            result = await true_or_unavailable(proxied, store, store.complete(lease, b"stored"))
            record = await store.get(key)
            assert record is not None and record.token == lease.token
            if record.status is Status.IN_PROGRESS:
                # The cut came before the statement ran: the holder's retry completes.
                assert result is not True
                assert await store.complete(lease, b"stored") is True
            else:
                assert record.response == b"stored"


async def test_a_lost_reply_never_turns_a_release_into_a_refusal(proxied: Proxied) -> None:
    async with open_store(proxied.url) as store:
        for _ in range(3):
            key = new_key()
            await warm_up(store)
            lease = await acquire(store, key)
            await store.release(await acquire(store, new_key()))  # prepares release too
            proxied.proxy.drop_next_reply()
            result = await true_or_unavailable(proxied, store, store.release(lease))
            again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
            if again.outcome is Outcome.IN_PROGRESS:
                # The cut came before the release ran: the holder still holds the key.
                assert result is not True
                assert await store.release(lease) is True
            else:
                assert again.outcome is Outcome.ACQUIRED and again.lease is not None
                assert again.lease.fence == lease.fence + 1 and not again.takeover


async def test_a_lost_reserve_reply_leaves_the_key_to_lapse_not_to_run_twice(
    proxied: Proxied,
) -> None:
    async with open_store(proxied.url) as store:
        key = new_key()
        await warm_up(store)
        proxied.proxy.drop_next_reply()
        result, _ = await timed(lambda: store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
        if isinstance(result, StoreUnavailableError):
            # The engine made the reservation and nobody holds its lease: a retry must wait
            # for it to lapse rather than run the work a second time.
            await recovered(store)
            again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
            assert again.outcome is Outcome.IN_PROGRESS
        else:
            # The client retried by itself and the engine recognised its own reservation.
            assert result.outcome is Outcome.ACQUIRED
            assert result.lease is not None and result.lease.fence == 1


class NetworkFaultSchedule(FaultScenario):
    """Latency, random cuts in mid-request, mass resets and half-open periods, one after the
    other, each long enough for workers to run into it, with clean spells between."""

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__()
        self.proxy = proxy

    def run(self, stop: threading.Event) -> None:
        proxy = self.proxy

        def spell(seconds: float) -> None:
            stop.wait(seconds)

        spell(1.0)
        proxy.latency = 0.02
        spell(1.5)
        proxy.latency = 0.0
        proxy.drop_rate = 0.05
        spell(2.0)
        proxy.drop_rate = 0.0
        for _ in range(3):
            proxy.drop_connections()
            spell(0.3)
        proxy.hang()
        spell(2.0)
        proxy.resume()
        spell(0.5)
        proxy.latency = 0.01
        proxy.drop_rate = 0.03
        spell(1.5)
        proxy.latency = 0.0
        proxy.drop_rate = 0.0
        proxy.hang()
        spell(1.0)
        proxy.resume()
        spell(0.5)
        self.counts.update(proxy.counts)


@pytest.mark.slow
# DynamoDB (moto) runs these histories about four times slower; its single-fault tests above
# and its SIGKILL history (test_history.py) cover it.
@pytest.mark.parametrize("proxied", ["postgres", "redis"], indirect=True)
def test_history_holds_through_network_faults(
    proxied: Proxied,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    config = WorkerConfig(call_cap=proxied.bound * 3)
    scenario = NetworkFaultSchedule(proxied.proxy)
    report = run_history(
        proxied.url,
        tmp_path,
        workers=4,
        keys_per_round=30,
        kills=4,
        config=config,
        seed=seed,
        scenario=scenario,
        final_url=proxied.direct_url,
    )
    report_counts({"backend": proxied.backend, "fault": "network", **report.row()})
    assert report.violations == [], report.summary()
    assert report.untyped_errors == [], report.summary()
    assert report.counts["errors"] > 0, "the faults never reached a call"
    for op, seconds in report.max_call_seconds.items():
        limit = proxied.bound + (config.lease_ttl * 2 if op == "wait" else 0)
        assert seconds < limit, (op, seconds, report.summary())
