"""What a bench run measured, and the statistics drawn from it.

A ``Timing`` is one timed loop (a backend's or its floor's); a ``Measurement`` pairs a backend's
timing with its floor's for one scenario at one concurrency; a ``BenchResult`` is the whole run.
Latencies stay in nanoseconds until they are summarized, in milliseconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from idemstore.bench.runner import Target

__all__ = [
    "BenchResult",
    "Measurement",
    "NotApplicable",
    "Timing",
    "Unavailable",
    "added_latency",
    "on_each_target",
    "percentile",
    "through_layer",
    "ratio",
]

# The percentiles every report shows, as (label, fraction).
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 0.50),
    ("p90", 0.90),
    ("p99", 0.99),
    ("p99.9", 0.999),
)


def percentile(ordered: list[int], fraction: float) -> int:
    """The nearest-rank percentile of an ascending, non-empty list."""
    if not ordered:
        raise ValueError("percentile of no samples")
    # round() first: 10 * 0.9 is 9.000000000000002, whose ceiling would skip a rank.
    rank = max(1, math.ceil(round(len(ordered) * fraction, 9)))
    return ordered[min(len(ordered), rank) - 1]


def added_latency(subject: Timing, baseline: Timing, prefix: str = "") -> dict[str, float]:
    """What ``subject`` adds to ``baseline`` at p50 and p99, in ms: ``{prefix}added_p50_ms``."""
    added = {}
    for label in ("p50", "p99"):
        ours, theirs = subject.latency_ms()[label], baseline.latency_ms()[label]
        if ours is not None and theirs is not None:
            added[f"{prefix}added_{label}_ms"] = ours - theirs
    return added


def through_layer(
    layer: str,
    through: Timing,
    direct: Timing,
    *,
    direct_name: str,
    store: str,
    notes: dict[str, Any],
) -> Measurement:
    """Calls through an idemstore layer (the ``proxy``, the ``gateway``: one worker, on
    ``store``) against the same calls made directly. ``through.executions`` counts identical
    calls (1 is right); the notes get the latency the layer adds."""
    measurement = Measurement.of_one_caller(
        f"mcp {layer}",
        layer,
        through,
        direct,
        direct_name,
        url=store,
        notes={"store": store, **notes, **added_latency(through, direct)},
    )
    measurement.expected_executions = 1  # every call is the same one
    return measurement


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the divisor is 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


@dataclass(slots=True)
class Timing:
    """One timed loop: a latency per successful operation, failures counted by type.

    ``executions`` counts operations that really ran the work (an acquired reserve, an
    inserted floor row); ``unique_keys`` counts the keys that should each run exactly once.
    """

    latencies_ns: list[int] = field(default_factory=list)
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)
    executions: int = 0
    unique_keys: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def ops(self) -> int:
        """Operations attempted: successes and failures."""
        return len(self.latencies_ns) + sum(self.errors.values())

    @property
    def ops_per_s(self) -> float | None:
        """Successful operations per second of wall time, all workers together."""
        if self.seconds <= 0 or not self.latencies_ns:
            return None
        return len(self.latencies_ns) / self.seconds

    def latency_ms(self) -> dict[str, float | None]:
        """p50, p90, p99, p99.9, mean and max in milliseconds (``None`` without samples)."""
        keys = [label for label, _ in PERCENTILES] + ["mean", "max"]
        if not self.latencies_ns:
            return dict.fromkeys(keys)
        ordered = sorted(self.latencies_ns)
        summary: dict[str, float | None] = {
            label: percentile(ordered, fraction) / 1e6 for label, fraction in PERCENTILES
        }
        summary["mean"] = sum(ordered) / len(ordered) / 1e6
        summary["max"] = ordered[-1] / 1e6
        return summary

    async def time_call(self, call: Awaitable[bool]) -> None:
        """Await ``call`` (``True`` when it ran the work): its latency, or its error."""
        started = time.perf_counter_ns()
        try:
            executed = await call
        except Exception as exc:
            self.record_error(exc)
        else:
            self.latencies_ns.append(time.perf_counter_ns() - started)
            self.executions += executed

    def record_error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        self.error_examples.setdefault(name, str(exc)[:300])

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "seconds": round(self.seconds, 6),
            "ops_per_s": self.ops_per_s,
            "latency_ms": self.latency_ms(),
            "errors": dict(self.errors),
            "error_examples": dict(self.error_examples),
            "executions": self.executions,
            "unique_keys": self.unique_keys,
            "outcomes": dict(self.outcomes),
        }


@dataclass(slots=True)
class Measurement:
    """A subject (a backend, a hasher, the proxy) against its floor for one shape of load.

    ``expected_executions`` is how many executions a correct subject shows (``None`` where
    executions mean nothing, as for hashing).
    """

    backend: str
    scenario: str
    concurrency: int
    subject: Timing
    floor: Timing | None = None
    floor_name: str | None = None
    url: str | None = None
    expected_executions: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_one_caller(
        cls,
        backend: str,
        scenario: str,
        subject: Timing,
        floor: Timing,
        floor_name: str,
        *,
        url: str | None = None,
        notes: dict[str, Any] | None = None,
    ) -> Measurement:
        """One caller's subject against its floor, where a correct subject runs each of its
        keys once; ``url`` is shown as given (redact it first)."""
        return cls(
            backend=backend,
            scenario=scenario,
            concurrency=1,
            subject=subject,
            floor=floor,
            floor_name=floor_name,
            url=url,
            expected_executions=subject.unique_keys,
            notes=notes or {},
        )

    @property
    def ratio_p50(self) -> float | None:
        """Subject p50 over floor p50: how many times the floor's latency the subject costs."""
        if self.floor is None:
            return None
        return ratio(self.subject.latency_ms()["p50"], self.floor.latency_ms()["p50"])

    @property
    def ratio_throughput(self) -> float | None:
        """Floor ops/s over subject ops/s: how many times fewer operations the subject does."""
        if self.floor is None:
            return None
        return ratio(self.floor.ops_per_s, self.subject.ops_per_s)

    @property
    def exactly_once(self) -> bool | None:
        """Whether executions matched what a correct subject shows."""
        if self.expected_executions is None:
            return None
        return self.subject.executions == self.expected_executions

    def to_dict(self) -> dict[str, Any]:
        subject = self.subject.to_dict()
        return {
            "backend": self.backend,
            "url": self.url,
            "scenario": self.scenario,
            "concurrency": self.concurrency,
            **subject,
            "expected_executions": self.expected_executions,
            "exactly_once": self.exactly_once,
            "floor": None
            if self.floor is None
            else {"name": self.floor_name, **self.floor.to_dict()},
            "ratio_p50": self.ratio_p50,
            "ratio_throughput": self.ratio_throughput,
            "notes": dict(self.notes),
        }


class NotApplicable(Exception):
    """A scenario does not apply to a target (settling in a transaction on a store no caller's
    connection reaches): the run reports it skipped, the message saying why; not a failure."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A backend (or one scenario of it, or its floor) that could not run, and why."""

    backend: str
    reason: str
    scenario: str | None = None
    # The idemstore extra whose absence skipped it ("gateway", "local", ...): not a failure.
    extra: str | None = None
    # It does not apply here (NotApplicable, a missing target or package): not a failure.
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "scenario": self.scenario,
            "reason": self.reason,
            "extra": self.extra,
            "skipped": self.skipped,
        }


@dataclass(slots=True)
class BenchResult:
    """A whole run: where and how it ran, every measurement, and what could not run."""

    meta: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)

    @property
    def violations(self) -> list[Measurement]:
        """Measurements whose executions did not match (a correctness failure)."""
        return [m for m in self.measurements if m.exactly_once is False]

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": dict(self.meta),
            "config": dict(self.config),
            "results": [m.to_dict() for m in self.measurements],
            "unavailable": [u.to_dict() for u in self.unavailable],
        }


async def on_each_target(
    targets: Sequence[Target], scenario: str, one: Callable[[Target], Awaitable[Measurement]]
) -> list[Measurement | Unavailable]:
    """``one`` on every target in turn; a target it fails on, or that it does not apply to
    (``NotApplicable``: skipped), is ``Unavailable`` for ``scenario``, and the others still
    run."""
    measured: list[Measurement | Unavailable] = []
    for target in targets:
        try:
            measured.append(await one(target))
        except NotApplicable as exc:
            measured.append(Unavailable(target.name, str(exc), scenario, skipped=True))
        except Exception as exc:
            measured.append(Unavailable(target.name, f"{type(exc).__name__}: {exc}", scenario))
    return measured
