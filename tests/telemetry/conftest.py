"""An OpenTelemetry SDK with in-memory readers, installed through ``idemstore.instrument()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import idemstore
from idemstore import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    from opentelemetry.sdk.trace import ReadableSpan

    from idemstore import IdempotencyStore

# The engines these tests script runs on: the in-process one and two servers.
STORE_URL_FIXTURES: dict[str, str] = {
    "memory": "memory_store_url",
    "postgres": "postgres_store_url",
    "redis": "redis_store_url",
}


@dataclass
class Telemetry:
    """What the SDK collected: metric points by name and attributes, and finished spans."""

    reader: InMemoryMetricReader
    exporter: InMemorySpanExporter
    meter_provider: MeterProvider
    tracer_provider: TracerProvider

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def total(self, name: str, **attributes: object) -> int:
        """Sum of a counter (or count of a histogram) over points matching ``attributes``."""
        return sum(_amount(p) for p in self.points(name) if _matches(p.attributes, attributes))

    def totals_by(self, name: str, attribute: str) -> dict[object, int]:
        """``total`` of ``name`` for each value of ``attribute`` (points without it left out)."""
        totals: dict[object, int] = {}
        for point in self.points(name):
            if attribute in point.attributes:
                value = point.attributes[attribute]
                totals[value] = totals.get(value, 0) + _amount(point)
        return totals

    def spans(self, name: str | None = None, **attributes: object) -> list[ReadableSpan]:
        """Finished spans (named ``name``, if given) whose attributes include ``attributes``."""
        spans = list(self.exporter.get_finished_spans())
        return [
            s
            for s in spans
            if (name is None or s.name == name) and _matches(s.attributes or {}, attributes)
        ]


def _amount(point: Any) -> int:
    """A counter point's value, or a histogram point's count."""
    return int(point.count if hasattr(point, "count") else point.value)


def _matches(found: Mapping[str, object], wanted: dict[str, object]) -> bool:
    return all(found.get(k) == v for k, v in wanted.items())


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    idemstore.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider)
    try:
        yield Telemetry(reader, exporter, meter_provider, tracer_provider)
    finally:
        idemstore.uninstrument()


@pytest.fixture(params=sorted(STORE_URL_FIXTURES))
async def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(STORE_URL_FIXTURES[request.param]))


@pytest.fixture
async def store(store_url: str, telemetry: Telemetry) -> AsyncIterator[IdempotencyStore]:
    """A store opened after ``instrument()``: ``open_store`` hands it out instrumented."""
    async with open_store(store_url) as opened:
        yield opened
