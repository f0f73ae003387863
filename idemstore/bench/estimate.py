"""How long an ``idemstore bench`` run will take, said before it starts.

A timed run (``--duration S``) is predictable: every store scenario times the store and its
floor for S seconds each, at every concurrency; ``hasher`` times its three hashers, ``proxy``
its three ways of calling and ``gateway`` its two for S seconds in all each; the probes,
``middleware`` and ``telemetry`` take a fixed number of samples. Add what each step was
measured to need besides its timed load (``SETUP_SECONDS``) and the sum is the estimate.

A run by operation count (the default) lasts as long as the slowest backend takes for its
operations, which is not known before it runs: the plan then says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from idemstore.bench.scenarios import STORE_SCENARIOS, TARGET_PROBES
from idemstore.registry import engine_for_url, engines

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.bench.runner import BenchConfig
    from idemstore.registry import Engine

__all__ = ["ONCE_PER_BENCH", "Plan", "plan_run", "step_count"]

# The scenarios measured once per run, not per backend, in the order they run.
ONCE_PER_BENCH: tuple[str, ...] = ("hasher", "proxy", "gateway", "telemetry", "middleware")
# Sides timed one after another for --duration seconds each, by scenario (store scenarios: the
# store, and its floor when the engine has one).
TIMED_SIDES = {"hasher": 3, "proxy": 3, "gateway": 1}
# Seconds a step takes besides its timed load, measured on the project's 2-core VM with
# `--duration 0.25`: interpreter start-ups (proxy: 3 processes a round, gateway: 2), fixed
# sample counts (probes, middleware, telemetry), preloads and warm-ups (store scenarios).
SETUP_SECONDS = {
    "store": 0.1,
    "wake": 0.4,
    "commands": 0.3,
    "replay-writes": 0.3,
    "hasher": 0.0,
    "proxy": 5.0,
    "gateway": 2.5,
    "telemetry": 1.0,
    "middleware": 0.6,
}


def step_count(config: BenchConfig, backends: int) -> int:
    """The measurements a run makes: the progress bar's total."""
    stores = sum(s in config.scenarios for s in STORE_SCENARIOS)
    probes = sum(s in config.scenarios for s in TARGET_PROBES)
    once = sum(s in config.scenarios for s in ONCE_PER_BENCH)
    return backends * (stores * len(config.concurrency) + probes) + once


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run will do, and in about how many seconds (``None``: not known beforehand)."""

    backends: int
    steps: int
    seconds: float | None
    local: bool

    def describe(self, config: BenchConfig) -> str:
        """One line for stderr, before the run."""
        what = f"{self.steps} measurements on {self.backends} backend(s)"
        servers = ", plus starting the local servers" if self.local else ""
        if self.seconds is None:
            return (
                f"{what}, {config.ops} operations each{servers}; the time depends on the"
                " backends (--duration S bounds each measurement and gives an estimate)"
            )
        return f"{what}, {config.duration:g} s each: about {self.seconds:.0f} s{servers}"


def _targets(urls: Sequence[str], *, local: bool) -> list[Engine | None]:
    """The engine of every backend a run measures (``None``: an unknown scheme)."""
    planned: list[Engine | None] = [engine_for_url(url) for url in urls]
    if not urls or local:
        planned += [engine for engine in engines() if engine.embedded is not None]
    if local:
        planned += [engine for engine in engines() if engine.launcher is not None]
    return planned


def _target_seconds(config: BenchConfig, duration: float, engine: Engine | None) -> float:
    sides = 2 if engine is not None and engine.floor is not None else 1
    stores = sum(s in config.scenarios for s in STORE_SCENARIOS) * len(config.concurrency)
    seconds = stores * (sides * duration + SETUP_SECONDS["store"])
    return seconds + sum(SETUP_SECONDS[p] for p in TARGET_PROBES if p in config.scenarios)


def plan_run(config: BenchConfig, urls: Sequence[str], *, local: bool = False) -> Plan:
    """The plan of ``idemstore bench`` on ``urls`` (the embedded backends when there are none
    or ``local`` is set, and the local servers with ``local``)."""
    targets = _targets(urls, local=local)
    seconds = None
    if config.duration is not None:
        seconds = sum(_target_seconds(config, config.duration, engine) for engine in targets)
        for scenario in ONCE_PER_BENCH:
            if scenario in config.scenarios:
                sides = TIMED_SIDES.get(scenario, 0)
                seconds += sides * config.duration + SETUP_SECONDS[scenario]
    return Plan(len(targets), step_count(config, len(targets)), seconds, local)
