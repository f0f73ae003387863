"""The ``consumers`` bench scenario runs on every broker and counts one execution per message
(a benchmark is not a test: this checks that it runs, not what it measures)."""

from __future__ import annotations

import pytest

from idemstore.bench import Target
from idemstore.bench.consumers_scenario import BROKERS, run_consumers
from idemstore.bench.results import Measurement
from idemstore.bench.scenarios import Load
from tests.reliability.test_consumer_crashes import NEEDS, need

pytestmark = pytest.mark.slow


async def test_every_broker_is_measured_with_and_without_the_door() -> None:
    for broker in NEEDS:
        need(broker)  # the scenario starts its own brokers
    measured = await run_consumers([Target("memory", "memory://")], Load(1, 80, None, 256), "t")
    assert [m.backend for m in measured] == [f"{name} / memory" for name in BROKERS]
    for measurement in measured:
        assert isinstance(measurement, Measurement)
        assert measurement.exactly_once
        assert measurement.floor is not None
        assert len(measurement.subject.latencies_ns) == len(measurement.floor.latencies_ns) == 40
