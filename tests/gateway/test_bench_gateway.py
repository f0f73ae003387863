"""The ``gateway`` bench scenario measures both paths in one run and counts executions."""

from __future__ import annotations

from idemstore.bench.gateway_scenario import _time_calls, run_gateway
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
    # Requests other than tools/call, relayed by their Mcp-Method header and parsed.
    assert {"pass_through_by_header_p50_ms", "pass_through_parsed_p50_ms"} <= set(measured.notes)


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


class _Answer:
    status_code = 200

    def json(self) -> dict[str, object]:
        return {"jsonrpc": "2.0", "id": 1, "result": {}}


class _Client:
    def __init__(self) -> None:
        self.calls = 0

    async def post(self, url: str, **kwargs: object) -> _Answer:
        self.calls += 1
        return _Answer()


async def test_a_timed_side_makes_its_minimum_of_calls_however_short_its_time() -> None:
    # A p99 over a few hundred calls is their third slowest: duration mode keeps going until
    # each side has made enough calls for its tail to mean something.
    client = _Client()
    timing = await _time_calls(client, "http://127.0.0.1:1/mcp", None, 0.0, "x", at_least=50)
    assert client.calls == len(timing.latencies_ns) == 50
    # --ops is exact: the minimum does not apply.
    client = _Client()
    timing = await _time_calls(client, "http://127.0.0.1:1/mcp", 7, None, "x", at_least=50)
    assert client.calls == 7
