"""The ``telemetry`` bench scenario: what ``idemstore.instrument()`` costs a keyed call.

One worker runs ``Idempotency.run`` on a memory store (the engine that adds least, so the
instrumentation's share is largest), half fresh keys and half replays, four ways in one
process, in interleaved rounds so that drift hits all alike:

- ``otel off``: ``instrument()`` never called, the path every user has today;
- ``otel off, rerun``: the same, a second time: the spread between the two is the noise;
- ``otel, no SDK``: ``instrument()`` with OpenTelemetry's default no-op providers;
- ``otel + SDK``: with the OpenTelemetry SDK's providers (spans and metrics recorded,
  exported nowhere), when ``opentelemetry-sdk`` is installed.

Each is reported against the first as its floor, so ``ratio_p50`` is the relative cost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from idemstore import telemetry
from idemstore.backends.urls import open_store
from idemstore.bench.results import Measurement, Timing, Unavailable
from idemstore.runner import Idempotency

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.bench.scenarios import Load

__all__ = ["BASELINE", "RERUN", "run_telemetry"]

ROUNDS = 5
# Labels short enough for the 80-column table.
BASELINE = "otel off"
RERUN = "otel off, rerun"
FINGERPRINT = "telemetry-bench"
RESPONSE = b"x" * 256


def _variants() -> dict[str, Callable[[], None] | None]:
    """Label -> how to switch instrumentation on (``None``: off)."""
    variants: dict[str, Callable[[], None] | None] = {
        BASELINE: None,
        RERUN: None,
    }
    try:
        import opentelemetry  # noqa: F401
    except ImportError:
        return variants
    variants["otel, no SDK"] = telemetry.instrument
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return variants

    def with_sdk() -> None:
        # Spans are built and ended but exported nowhere; metrics are aggregated in memory.
        meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
        telemetry.instrument(meter_provider=meters, tracer_provider=TracerProvider())

    variants["otel + SDK"] = with_sdk
    return variants


async def _round(timing: Timing, count: int) -> None:
    # A fresh store every round: every key is new to it.
    async with open_store("memory://") as store:
        runner = Idempotency(store)

        async def work() -> bytes:
            return RESPONSE

        clock = time.perf_counter_ns
        started = time.perf_counter()
        for j in range(count):
            # Every key runs once, then replays once.
            key = f"k{j // 2}"
            begun = clock()
            result = await runner.run(key, FINGERPRINT, work)
            timing.latencies_ns.append(clock() - begun)
            if not result.replayed:
                timing.executions += 1
        timing.seconds += time.perf_counter() - started
        timing.unique_keys += (count + 1) // 2


async def run_telemetry(load: Load) -> list[Measurement] | Unavailable:
    """The scenario; ``Unavailable`` only if a variant fails outright."""
    per_round = max(2, (load.ops or 2000) // ROUNDS)
    variants = _variants()
    timings = {label: Timing() for label in variants}
    try:
        for _ in range(ROUNDS):
            for label, switch_on in variants.items():
                if switch_on is not None:
                    switch_on()
                try:
                    await _round(timings[label], per_round)
                finally:
                    telemetry.uninstrument()
    except Exception as exc:
        return Unavailable("telemetry", f"{type(exc).__name__}: {exc}", scenario="telemetry")
    baseline = timings[BASELINE]
    measurements = []
    for label, timing in timings.items():
        if label == BASELINE:
            continue
        notes: dict[str, Any] = {}
        ours, theirs = timing.latency_ms()["p50"], baseline.latency_ms()["p50"]
        if ours is not None and theirs is not None:
            notes["added_p50_ms"] = ours - theirs
        measurements.append(
            Measurement.of_one_caller(
                label, "telemetry", timing, baseline, BASELINE, url="memory://", notes=notes
            )
        )
    return measurements
