"""The OpenTelemetry instruments idemstore records into, built once by ``instrument()``.

Imported only by ``instrument()``: importing it needs ``opentelemetry-api``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import weakref
from contextlib import AbstractContextManager
from importlib import metadata
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanKind,
)

from idemstore.telemetry.attributes import BACKEND, KEY, KEY_HASH, SCOPE
from idemstore.telemetry.store import InstrumentedStore

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from idemstore.protocol import IdempotencyStore
    from idemstore.telemetry import KeyRecording

__all__ = ["Instruments"]

SCOPE_NAME = "idemstore"

# Store operations take from microseconds (memory) to hundreds of milliseconds (a remote
# engine under load); the SDK's default buckets start at 5 (meant for milliseconds).
DURATION_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# While no tracer provider is configured, the API is asked again after this many operations.
RECHECK_EVERY = 64

# What start_span gives when spans go nowhere: the API's own non-recording span, which takes
# attributes and status and drops them.
_NO_SPAN: AbstractContextManager[Span] = contextlib.nullcontext(INVALID_SPAN)

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Instruments:
    """The tracer, the meters and the key policy; stores and consumers record through it."""

    __slots__ = (
        "_tracer_provider",
        "_tracing",
        "_untraced",
        "_watched",
        "consumer_calls",
        "fenced_out",
        "heartbeat_failures",
        "operation_duration",
        "record_keys",
        "reserve_outcomes",
        "swept",
        "tracer",
        "wait_duration",
        "wait_timeouts",
    )

    def __init__(
        self,
        meter_provider: MeterProvider | None,
        tracer_provider: TracerProvider | None,
        record_keys: KeyRecording,
    ) -> None:
        version = _installed_version()
        meter = metrics.get_meter(SCOPE_NAME, version, meter_provider)
        self.tracer = trace.get_tracer(SCOPE_NAME, version or None, tracer_provider)
        self._tracer_provider = tracer_provider
        self._tracing = False
        self._untraced = 0
        self.record_keys = record_keys
        self.operation_duration = meter.create_histogram(
            "idemstore.store.operation.duration",
            unit="s",
            description="Duration of idempotency store operations.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.reserve_outcomes = meter.create_counter(
            "idemstore.reserve.outcomes",
            unit="{reservation}",
            description="Outcomes of reserve: acquired, completed, in_progress, mismatch.",
        )
        self.fenced_out = meter.create_counter(
            "idemstore.lease.fenced_out",
            unit="{lease}",
            description="complete, release or extend refused because the lease was lost.",
        )
        self.heartbeat_failures = meter.create_counter(
            "idemstore.heartbeat.failures",
            unit="{heartbeat}",
            description="Heartbeats that failed to extend their lease: lost, or a store error.",
        )
        self.wait_duration = meter.create_histogram(
            "idemstore.wait.duration",
            unit="s",
            description="Time spent waiting for another holder of a key.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.wait_timeouts = meter.create_counter(
            "idemstore.wait.timeouts",
            unit="{wait}",
            description="Waits that ran out their timeout with the key still in progress.",
        )
        self.swept = meter.create_counter(
            "idemstore.sweep.removed",
            unit="{record}",
            description="Records past retention removed by sweep.",
        )
        self.consumer_calls = meter.create_counter(
            "idemstore.consumer.calls",
            unit="{call}",
            description="Calls a consumer handled, by outcome (executed, replayed, conflict, ...).",
        )
        # Stores that check their engines' clocks (Redis, PostgreSQL: ``store.clocks``), read
        # when the meter collects; a store that is gone drops out.
        self._watched: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        meter.create_observable_gauge(
            "idemstore.store.clock_skew",
            callbacks=[self._clock_skews],
            unit="s",
            description="Largest difference between the clocks a store reaches (client included).",
        )

    def wrap(self, store: IdempotencyStore, *, backend: str | None = None) -> IdempotencyStore:
        """``store`` recording into these instruments (re-wrapped if it recorded elsewhere)."""
        if isinstance(store, InstrumentedStore):
            if store.instruments is self:
                return store
            backend = backend or store.backend
            store = store.wrapped
        wrapped = InstrumentedStore(store, self, backend=backend)
        clocks = getattr(store, "clocks", None)
        if clocks is not None:
            self._watched[clocks] = wrapped.backend
        return wrapped

    def _clock_skews(self, options: CallbackOptions) -> Iterator[Observation]:
        for clocks, backend in list(self._watched.items()):
            if clocks.skew.checks:
                yield Observation(clocks.skew.largest, {BACKEND: backend})

    def key_attributes(self, attributes: dict[str, Any], key: object, scope: object) -> None:
        """Add the key to span ``attributes`` as the user chose: not at all, hashed, or raw."""
        if not self.record_keys or not isinstance(key, str) or not isinstance(scope, str):
            return
        if self.record_keys == "hash":
            identity = f"{scope}\x00{key}".encode("utf-8", "surrogatepass")
            attributes[KEY_HASH] = hashlib.sha256(identity).hexdigest()[:32]
        else:
            attributes[KEY] = key
            attributes[SCOPE] = scope

    def tracing(self) -> bool:
        """Whether spans go anywhere: a real (SDK) tracer provider is configured.

        Without one, the API would build a non-recording span per operation at the cost of a
        real one's context bookkeeping; skipping it keeps ``instrument()`` without an SDK
        nearly free. The application may install its global provider after ``instrument()``:
        asking the API costs an environment lookup (about 4 us), so it is asked again only
        every ``RECHECK_EVERY`` operations until a provider is there (which then stays).
        """
        if self._tracing:
            return True
        self._untraced += 1
        if self._untraced % RECHECK_EVERY != 1:
            return False
        provider = self._tracer_provider or trace.get_tracer_provider()
        self._tracing = not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)
        return self._tracing

    def start_span(self, name: str, attributes: dict[str, Any]) -> AbstractContextManager[Span]:
        """A current span that records no exception text (it may quote a key or a body);
        a no-op stand-in when no tracer provider is configured."""
        if not self.tracing():
            return _NO_SPAN
        return self.tracer.start_as_current_span(
            name,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    def record_operation(self, attributes: dict[str, Any], started: float) -> None:
        self.operation_duration.record(time.perf_counter() - started, attributes)


def _installed_version() -> str:
    """idemstore's version for the instrumentation scope, from the installed distribution
    (the metadata the build wrote from ``idemstore.__version__``): importing the package
    for it would make telemetry import what imports telemetry. Empty when not installed."""
    try:
        return metadata.version("idemstore")
    except metadata.PackageNotFoundError:
        return ""
