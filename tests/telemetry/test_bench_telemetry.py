"""The ``telemetry`` bench scenario measures every variant and leaves instrumentation off."""

from __future__ import annotations

from idemstore import telemetry
from idemstore.bench.results import Measurement
from idemstore.bench.scenarios import Load
from idemstore.bench.telemetry_overhead import BASELINE, run_telemetry


async def test_telemetry_scenario_compares_each_variant_with_the_uninstrumented_path() -> None:
    measured = await run_telemetry(Load(concurrency=1, ops=100, duration=None, payload_bytes=16))
    assert isinstance(measured, list)
    assert [m.backend for m in measured] == [
        "otel off, rerun",
        "otel, no SDK",
        "otel + SDK",
    ]
    for measurement in measured:
        assert isinstance(measurement, Measurement)
        assert measurement.floor_name == BASELINE
        assert measurement.exactly_once  # every key ran once and replayed once
        assert measurement.ratio_p50 is not None
    assert telemetry.current() is None
