"""The ``gateway`` bench scenario measures both paths in one run and counts executions."""

from __future__ import annotations

from idemstore.bench.gateway_scenario import run_gateway
from idemstore.bench.results import Measurement
from idemstore.bench.scenarios import Load


async def test_gateway_scenario_times_both_paths_and_sees_one_execution() -> None:
    measured = await run_gateway(Load(1, 20, None, 16))
    assert isinstance(measured, Measurement), measured
    assert measured.subject.errors == {} and measured.floor is not None
    assert len(measured.subject.latencies_ns) == len(measured.floor.latencies_ns) == 20
    # Five identical key-less calls through the gateway: the upstream ran one.
    assert measured.subject.executions == 1
    assert {"added_p50_ms", "added_p99_ms"} <= set(measured.notes)
