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

from idemstore.backends.registry import engine_for_url, engines
from idemstore.bench.hasher_scenario import HASHERS, SHAPES
from idemstore.bench.peers_scenario import timed_sides
from idemstore.bench.scenarios import STORE_SCENARIOS, TARGET_PROBES, rounds_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.backends.registry import Engine
    from idemstore.bench.runner import BenchConfig

__all__ = ["ONCE_PER_BENCH", "Plan", "plan_run", "step_count"]

# The scenarios measured once per run, not per backend, in the order they run.
ONCE_PER_BENCH: tuple[str, ...] = (
    "hasher",
    "proxy",
    "gateway",
    "telemetry",
    "middleware",
    "sync",
    "settle",
    "peers",
    "consumers",
    "cost",
)
# Of those, the ones measured on each target in turn (one worker, a fixed operation count).
ONCE_ON_EACH_TARGET: tuple[str, ...] = ("sync", "settle", "peers", "cost")
# Sides timed one after another for --duration seconds each, by scenario (store scenarios: the
# store, and its floor when the engine has one).
TIMED_SIDES = {"hasher": len(HASHERS) * len(SHAPES), "proxy": 3, "gateway": 1}
# Seconds a step takes besides its timed load, measured on the project's 2-core VM (shared: a
# load average of 6 to 9) with `--duration 0.5` and 1: fixed sample counts (probes, middleware,
# telemetry) and interpreter start-ups (gateway: 2 processes; proxy: 5 every round).
SETUP_SECONDS = {
    "wake": 0.8,
    "commands": 0.3,
    "replay-writes": 0.3,
    "replay-cache": 0.3,
    "hasher": 0.0,
    "proxy": 0.0,  # PROXY_ROUND_SECONDS per round instead
    "gateway": 2.5,
    "sync": 4.0,  # per target: 9 to 13 s for memory and sqlite together
    "settle": 1.0,  # per target: opening a second connection, the business table
    "peers": 1.5,  # per target with a peer engine: opening each library, its table
    "cost": 3.0,  # per target: 1,600 calls on one worker, six store openings
    "telemetry": 1.4,
    "middleware": 1.1,
    "consumers": 25.0,  # four brokers started (RabbitMQ: 5 s), 4 rounds of 2 sides each
}
# The gateway's minimum of calls on each of its three sides (gateway_scenario.MIN_SAMPLES),
# at about 2.2 ms a call on the idle 2-core VM: 13 s, whatever the duration.
GATEWAY_MINIMUM_SECONDS = 13.0
# 1.7 s with a load average of 6, 5 s near 9: start-ups are what a busy machine slows most.
PROXY_ROUND_SECONDS = 2.5
# A store measurement's preload, warm-up (one operation per worker) and the operations still
# running at each round's deadline: a base, and more per worker (SQLite at 64: about 1.5 s).
STORE_SETUP_SECONDS = 0.15
STORE_SETUP_PER_WORKER = 0.02


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
        what = f"{_count(self.steps, 'measurement')} on {_count(self.backends, 'backend')}"
        servers = ", plus starting the local servers" if self.local else ""
        if self.seconds is None:
            return (
                f"{what}, {config.ops} operations each{servers}; the time depends on the"
                " backends (--duration S bounds each measurement and gives an estimate)"
            )
        return f"{what}, {config.duration:g} s each: about {self.seconds:.0f} s{servers}"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


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
    stores = sum(s in config.scenarios for s in STORE_SCENARIOS)
    seconds = 0.0
    for workers in config.concurrency:
        setup = STORE_SETUP_SECONDS + STORE_SETUP_PER_WORKER * workers
        seconds += stores * (sides * duration + setup)
    per_target = [p for p in (*TARGET_PROBES, *ONCE_ON_EACH_TARGET) if p != "peers"]
    seconds += sum(SETUP_SECONDS[p] for p in per_target if p in config.scenarios)
    # peers: idemstore's door and each peer of that door, about `duration` each, per level.
    if "peers" in config.scenarios and engine is not None and (sides := timed_sides(engine.name)):
        seconds += sides * duration * len(config.concurrency) + SETUP_SECONDS["peers"]
    return seconds


def _once_seconds(config: BenchConfig, duration: float) -> float:
    seconds = 0.0
    for scenario in ONCE_PER_BENCH:
        if scenario in config.scenarios and scenario not in ONCE_ON_EACH_TARGET:
            timed = TIMED_SIDES.get(scenario, 0) * duration
            if scenario == "gateway":
                timed = max(timed, GATEWAY_MINIMUM_SECONDS)
            seconds += timed + SETUP_SECONDS[scenario]
    if "proxy" in config.scenarios:
        seconds += PROXY_ROUND_SECONDS * len(rounds_of(config.load(1)))
    return seconds


def plan_run(config: BenchConfig, urls: Sequence[str], *, local: bool = False) -> Plan:
    """The plan of ``idemstore bench`` on ``urls`` (the embedded backends when there are none
    or ``local`` is set, and the local servers with ``local``)."""
    targets = _targets(urls, local=local)
    seconds = None
    if config.duration is not None:
        seconds = sum(_target_seconds(config, config.duration, engine) for engine in targets)
        seconds += _once_seconds(config, config.duration)
    return Plan(len(targets), step_count(config, len(targets)), seconds, local)
