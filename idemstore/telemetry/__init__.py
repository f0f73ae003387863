"""OpenTelemetry metrics and spans for stores and consumers, switched on by ``instrument()``.

Nothing here runs until ``instrument()`` is called: stores are not wrapped, consumers take their
plain path, and the ``opentelemetry`` packages are not even imported. After it, stores opened
with ``open_store`` record through the OpenTelemetry API, and so do the calls consumers and the
sweeper make (``instrument()`` registers an observer with ``idemstore.execution.hooks``, which
the execution path reports to; it hands them a recording view of a store built directly, and
never changes the caller's store). With no SDK configured that API does nothing, so the numbers
appear once the application installs a ``MeterProvider``/``TracerProvider`` (or passes them).

The metric and span names are listed in ``docs/observability.md`` and in ``METRICS`` below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from idemstore.errors import ConfigurationError, MissingDependencyError
from idemstore.execution.hooks import register_observer
from idemstore.install_lines import install_hint
from idemstore.telemetry.attributes import backend_name

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from idemstore.protocol import IdempotencyStore
    from idemstore.telemetry.instruments import Instruments

__all__ = [
    "METRICS",
    "Instrumentor",
    "KeyRecording",
    "backend_name",
    "current",
    "instrument",
    "instrumented",
    "uninstrument",
]

KeyRecording = Literal[False, True, "hash"]

# name -> (instrument kind, unit, attributes): the one table, mirrored in docs/observability.md
# (a test checks that the page lists every name here).
METRICS: dict[str, tuple[str, str, str]] = {
    "idemstore.store.operation.duration": (
        "histogram",
        "s",
        "idemstore.backend, idemstore.operation, error.type",
    ),
    "idemstore.reserve.outcomes": (
        "counter",
        "{reservation}",
        "idemstore.backend, idemstore.reserve.outcome, idemstore.reserve.takeover",
    ),
    "idemstore.lease.fenced_out": (
        "counter",
        "{lease}",
        "idemstore.backend, idemstore.operation",
    ),
    "idemstore.heartbeat.failures": (
        "counter",
        "{heartbeat}",
        "idemstore.backend, idemstore.heartbeat.failure, error.type",
    ),
    "idemstore.wait.duration": ("histogram", "s", "idemstore.backend, idemstore.wait.outcome"),
    "idemstore.wait.timeouts": ("counter", "{wait}", "idemstore.backend"),
    "idemstore.sweep.removed": ("counter", "{record}", "idemstore.backend"),
    "idemstore.store.clock_skew": ("gauge", "s", "idemstore.backend"),
    "idemstore.consumer.calls": (
        "counter",
        "{call}",
        "idemstore.consumer, idemstore.backend, idemstore.call.outcome, error.type",
    ),
}

_current: Instruments | None = None


def current() -> Instruments | None:
    """The active instruments, or ``None`` when ``instrument()`` was not called (the fast path)."""
    return _current


def instrument(
    *,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    record_keys: KeyRecording = False,
) -> None:
    """Record idemstore's metrics and spans from now on.

    Args:
        meter_provider: where metrics go; the global one (``opentelemetry.metrics``) when
            ``None``, which records nothing until an SDK provider is set.
        tracer_provider: where spans go; the global one when ``None``.
        record_keys: ``False`` (default) puts no key or scope on spans; ``"hash"`` puts a
            SHA-256 prefix of scope and key (correlates retries, but a guessable key can be
            recovered from it); ``True`` puts the raw key and scope.

    Call it once at startup, before opening stores. Calling it again replaces the providers.
    Raises ``MissingDependencyError`` when ``opentelemetry-api`` is not installed.
    """
    global _current
    if record_keys not in (False, True, "hash"):
        raise ConfigurationError(f"record_keys must be False, True or 'hash', not {record_keys!r}")
    try:
        from idemstore.telemetry.consumer import ConsumerObserver
        from idemstore.telemetry.instruments import Instruments
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        raise MissingDependencyError(
            f"idemstore.instrument() needs the OpenTelemetry API: {install_hint('otel')}"
        ) from exc
    _current = Instruments(meter_provider, tracer_provider, record_keys)
    register_observer(ConsumerObserver(_current))


def uninstrument() -> None:
    """Stop recording: consumers, the sweeper and newly opened stores take the plain path again.

    A store wrapped earlier and held by the application (one ``open_store`` returned while
    instrumented) keeps recording.
    """
    global _current
    _current = None
    register_observer(None)


def instrumented(store: IdempotencyStore, *, backend: str | None = None) -> IdempotencyStore:
    """``store`` wrapped so that it records spans and metrics, or ``store`` itself when
    ``instrument()`` was not called. Wrapping twice does not record twice. ``backend`` names
    the engine in ``idemstore.backend`` (default: ``backend_name(store)``)."""
    instruments = _current
    if instruments is None:
        return store
    return instruments.wrap(store, backend=backend)


class Instrumentor:
    """``instrument()`` for OpenTelemetry's auto-instrumentation.

    ``opentelemetry-instrument python app.py`` (from ``opentelemetry-distro``) configures the
    SDK from ``OTEL_*`` environment variables, then calls ``Instrumentor().instrument()`` for
    every ``opentelemetry_instrumentor`` entry point; idemstore declares this class there, so
    under it no line of code is needed.
    """

    def instrument(self, **options: Any) -> None:
        instrument(
            meter_provider=options.get("meter_provider"),
            tracer_provider=options.get("tracer_provider"),
        )

    def uninstrument(self, **options: Any) -> None:
        uninstrument()
