"""DynamoDB throttling (ProvisionedThroughputExceededException, ThrottlingException) injected
under load: every call ends in a result (the SDK's retries absorbed the throttle) or a typed
``StoreUnavailableError`` within its bound, and no key ever runs twice while its lease lives."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import StoreUnavailableError, open_store
from tests.reliability.history import FaultScenario, WorkerConfig, run_history
from tests.reliability.throttling_proxy import ThrottlingProxy

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator
    from pathlib import Path

SLACK = 2.0  # headroom for a loaded 2-core machine; bounds a hang, not a latency figure
OPTIONS = "max_attempts=3&connect_timeout=1&read_timeout=2"
# botocore's "standard" retries sleep at most 1 s, then 2 s, between three attempts, and each
# attempt lasts at most connect + read timeout.
BOUND = (1 + 2) + 3 * (1 + 2) + SLACK
# (throttled share of requests, seconds): clean, light, heavy, total (longer than the SDK's
# three attempts, so calls surface the throttle), light, clean.
SCHEDULE = ((0.0, 1.5), (0.2, 2.0), (0.5, 2.0), (1.0, 4.0), (0.3, 2.0), (0.0, 1.0))


def through(proxy: ThrottlingProxy, store_url: str) -> str:
    """``store_url`` with its endpoint replaced by the proxy's, and the retry options set."""
    base, _, query = store_url.partition("?")
    kept = [part for part in query.split("&") if not part.startswith("endpoint_url=")]
    return f"{base}?{'&'.join(kept)}&endpoint_url={proxy.url}&{OPTIONS}"


@pytest.fixture
def throttling(dynamodb_endpoint: str, seed: int) -> Iterator[ThrottlingProxy]:
    with ThrottlingProxy(dynamodb_endpoint, seed=seed) as proxy:
        yield proxy


class Throttle(FaultScenario):
    """Walk the proxy through ``SCHEDULE`` while the workers run."""

    def __init__(self, proxy: ThrottlingProxy) -> None:
        super().__init__()
        self.proxy = proxy

    def run(self, stop: threading.Event) -> None:
        try:
            for rate, seconds in SCHEDULE:
                self.proxy.rate = rate
                if stop.wait(seconds):
                    return
        finally:
            self.proxy.rate = 0.0
            self.counts.update(self.proxy.counts)


async def test_fully_throttled_calls_fail_typed_within_their_bound(
    throttling: ThrottlingProxy, dynamodb_store_url: str
) -> None:
    async with open_store(through(throttling, dynamodb_store_url)) as store:
        throttling.rate = 1.0
        throttling.counts.clear()
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match=r"throttl|Throughput"):
                await store.reserve(f"k-{uuid.uuid4().hex}", "fp", lease_ttl=10, retention=60)
            assert time.monotonic() - started < BOUND
    # Three attempts per call, none of which reached the endpoint.
    assert throttling.counts["throttled requests"] == throttling.counts["requests"] >= 9


async def test_sdk_retries_absorb_light_throttling_without_a_second_execution(
    throttling: ThrottlingProxy, dynamodb_store_url: str
) -> None:
    executions = 0
    async with open_store(through(throttling, dynamodb_store_url)) as store:
        throttling.rate = 0.3

        async def once(key: str) -> None:
            nonlocal executions
            reservation = await store.reserve(key, "fp", lease_ttl=30, retention=60)
            if reservation.acquired:
                assert reservation.lease is not None
                executions += 1
                assert await store.complete(reservation.lease, b"done")

        keys = [f"k-{i}-{uuid.uuid4().hex[:8]}" for i in range(10)]
        outcomes = await asyncio.gather(
            *(once(key) for key in keys for _ in range(3)), return_exceptions=True
        )
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(f, StoreUnavailableError) for f in failures), failures
    assert throttling.counts["throttled requests"] > 0
    assert executions <= len(keys)
    # Light throttling is what the retries are for: most calls get through.
    assert len(failures) < len(outcomes) // 2, failures


@pytest.mark.slow
def test_history_holds_while_dynamodb_throttles(
    throttling: ThrottlingProxy,
    dynamodb_store_url: str,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> None:
    config = WorkerConfig(call_cap=BOUND * 3)
    report = run_history(
        through(throttling, dynamodb_store_url),
        tmp_path,
        workers=4,
        keys_per_round=30,
        kills=3,
        config=config,
        seed=seed,
        scenario=Throttle(throttling),
        final_url=dynamodb_store_url,
    )
    report_counts({"backend": "dynamodb", "fault": "throttling", **report.row()})
    assert report.violations == [], report.summary()
    assert report.untyped_errors == [], report.summary()
    assert report.counts["duplicates found"] == 0
    # How many calls meet the fully throttled spell depends on the machine's load (moto serves
    # one request at a time); that a throttle surfaces typed and in time is asserted above.
    assert report.run["throttled requests"] > 0
    for op, seconds in report.max_call_seconds.items():
        limit = BOUND + (config.lease_ttl * 2 if op == "wait" else 0)
        assert seconds < limit, (op, seconds, report.summary())
