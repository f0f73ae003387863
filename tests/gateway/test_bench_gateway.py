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


async def test_gateway_scenario_measures_a_bare_reverse_proxy_as_its_floor() -> None:
    measured = await run_gateway(Load(1, 8, None, 16))
    assert isinstance(measured, Measurement), measured
    notes = measured.notes
    assert {"relay_added_p50_ms", "relay_added_p99_ms"} <= set(notes)
    # The ratios are None only when the bare proxy added nothing measurable.
    for label in ("p50", "p99"):
        times = notes[f"relay_x_added_{label}"]
        assert (
            times is None or times == notes[f"added_{label}_ms"] / notes[f"relay_added_{label}_ms"]
        )
