"""Running a whole bench: which backends, in which order, each beside its floor.

``bench`` is the entry point the CLI calls: it picks the targets (the URLs given; the embedded
backends when none are; the local servers with ``local=True``), runs every selected scenario at
every concurrency on each, and returns a ``BenchResult``. A backend that cannot be opened, or a
scenario that fails outright, is recorded as unavailable and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from idemstore import __version__
from idemstore.backends.registry import engine_for_scheme, engine_for_url, engines, scheme_of
from idemstore.backends.urls import open_store, redact_url
from idemstore.bench.consumers_scenario import run_consumers
from idemstore.bench.cost_scenario import run_cost
from idemstore.bench.estimate import ONCE_PER_BENCH, step_count
from idemstore.bench.floors import floor_for_url
from idemstore.bench.gateway_scenario import run_gateway
from idemstore.bench.hasher_scenario import run_hasher
from idemstore.bench.local import start_local_servers, stop_local_servers
from idemstore.bench.peers_scenario import PEERS, default_scenarios, run_peers
from idemstore.bench.probes import run_middleware, run_target_probe
from idemstore.bench.results import BenchResult, Measurement, Unavailable
from idemstore.bench.scenarios import (
    SCENARIOS,
    STORE_SCENARIOS,
    TARGET_PROBES,
    Load,
    run_interleaved,
    run_proxy,
)
from idemstore.bench.settle_scenario import run_settle
from idemstore.bench.sync_scenario import run_sync
from idemstore.bench.telemetry_overhead import run_telemetry

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.bench.floors import Floor
    from idemstore.protocol import IdempotencyStore

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_OPS",
    "BenchConfig",
    "ConsoleProgress",
    "Progress",
    "Target",
    "bench",
    "embedded_targets",
    "run_bench",
]

# Operations per measurement by default: the embedded run (memory and a synchronous=FULL
# SQLite file, every scenario at 1, 16 and 64 workers) takes about a minute on 2 cores.
DEFAULT_OPS = 2000
DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 16, 64)
DEFAULT_PAYLOAD_BYTES = 256

# Packages whose versions a report states besides every engine's driver (when installed).
REPORTED_PACKAGES = ("rfc8785", "mcp", *(peer.distribution for peer in PEERS))


def _reported_packages() -> tuple[str, ...]:
    names: list[str] = []
    for engine in engines():
        names += [engine.driver] if engine.driver else []
        names += engine.report_packages
    return tuple(dict.fromkeys([*names, *REPORTED_PACKAGES]))


@dataclass(frozen=True, slots=True)
class Target:
    """A backend to measure: a display name and its store URL.

    ``migrate`` applies the store's migrations first (servers started by ``--local`` are empty).
    """

    name: str
    url: str
    migrate: bool = False


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to run: scenarios, worker counts, and ``ops`` per measurement or ``duration``."""

    # Every scenario; peers only when a peer package is installed (peers_scenario.py).
    scenarios: tuple[str, ...] = field(default_factory=lambda: default_scenarios(SCENARIOS))
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    ops: int | None = DEFAULT_OPS
    duration: float | None = None
    payload_bytes: int = DEFAULT_PAYLOAD_BYTES
    command: str | None = None

    def load(self, concurrency: int) -> Load:
        return Load(concurrency, self.ops, self.duration, self.payload_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenarios": list(self.scenarios),
            "concurrency": list(self.concurrency),
            "ops": self.ops,
            "duration": self.duration,
            "payload_bytes": self.payload_bytes,
            "command": self.command,
        }


class Progress(Protocol):
    """Where a run reports how far it got."""

    def start(self, total: int) -> None: ...

    def step(self, description: str) -> None: ...

    def advance(self) -> None: ...


class _SilentProgress:
    def start(self, total: int) -> None:
        return None

    def step(self, description: str) -> None:
        return None

    def advance(self) -> None:
        return None


class ConsoleProgress:
    """A rich progress bar on stderr (plain lines when rich is missing); use as a context."""

    __slots__ = ("_bar", "_done", "_stream", "_task", "_total")

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        self._task: Any = None
        self._done = 0
        self._total = 0

    def __enter__(self) -> ConsoleProgress:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
        except ImportError:
            return self
        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=self._stream),
            transient=True,
        )
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def start(self, total: int) -> None:
        self._total = total
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task("starting", total=total)
        else:
            self._bar.update(self._task, total=total)

    def step(self, description: str) -> None:
        if self._bar is not None:
            # A step before start() (local servers starting) gets a bar without a total yet.
            if self._task is None:
                self._task = self._bar.add_task(description, total=None)
            self._bar.update(self._task, description=description)
        elif self._total:
            print(f"[{self._done + 1}/{self._total}] {description}", file=self._stream, flush=True)
        else:
            print(description, file=self._stream, flush=True)

    def advance(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.advance(self._task)


def _machine() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_idle(sys_root: Path = Path("/sys")) -> str | None:
    """How this machine's idle CPUs wait (Linux cpuidle), or None where it is not exposed.

    Latency through a relay is mostly wake-ups of idle CPUs; in a virtual machine whose
    guest halts at once (haltpoll with ``guest_halt_poll_ns`` 0) each costs tens of
    microseconds more than on one that polls first, so a run records which it was.
    """
    cpuidle = sys_root / "devices/system/cpu/cpuidle"
    try:
        driver = (cpuidle / "current_driver").read_text().strip()
    except OSError:
        return None
    facts = [f"cpuidle {driver}"]
    with contextlib.suppress(OSError):
        poll = (sys_root / "module/haltpoll/parameters/guest_halt_poll_ns").read_text().strip()
        facts.append(f"guest_halt_poll_ns {poll}")
    return ", ".join(facts)


def _meta() -> dict[str, Any]:
    versions = {}
    for name in _reported_packages():
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return {
        "idemstore": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": _machine(),
        "cpus": os.cpu_count(),
        "cpu_idle": cpu_idle(),
        "versions": versions,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _engine(url: str) -> str:
    """The name reports give ``url``'s engine (its registry label), else the URL's scheme."""
    scheme = scheme_of(url)
    engine = engine_for_scheme(scheme)
    return scheme if engine is None else engine.label(scheme)


def name_targets(urls: Sequence[str]) -> list[Target]:
    """A target per URL, named after its engine (``redis``, ``redis-2``, … when repeated)."""
    seen: dict[str, int] = {}
    targets = []
    for url in urls:
        engine = _engine(url) if "://" in url else url
        seen[engine] = seen.get(engine, 0) + 1
        name = engine if seen[engine] == 1 else f"{engine}-{seen[engine]}"
        targets.append(Target(name, url))
    return targets


def embedded_targets(tmpdir: Path) -> list[Target]:
    """Every registered engine that runs in-process (memory, and SQLite in a fresh file under
    ``tmpdir``), by its ``embedded`` URL."""
    return [
        Target(engine.name, engine.embedded.replace("{dir}", str(tmpdir)))
        for engine in engines()
        if engine.embedded is not None
    ]


async def _migrate(store: IdempotencyStore, url: str) -> None:
    """Bring the store's schema up to date (a fresh local server has none), whatever its kind."""
    from idemstore.backends.schema import schema_manager

    await schema_manager(store, url).apply()


def _not_opened(target: Target, exc: Exception) -> Unavailable:
    """Why ``target`` could not be opened: its extra when its driver is missing (a skip, not
    a failure), else the error."""
    engine = engine_for_url(target.url)
    driver = None if engine is None else engine.driver
    if engine is not None and engine.extra and driver and importlib.util.find_spec(driver) is None:
        return Unavailable(target.name, f"{driver} is not installed", extra=engine.extra)
    return Unavailable(target.name, f"{type(exc).__name__}: {exc}")


async def _hasher(_targets: Sequence[Target], load: Load, _prefix: str) -> list[Measurement]:
    return run_hasher(load)


async def _proxy(_targets: Sequence[Target], load: Load, _prefix: str) -> Measurement | Unavailable:
    return await run_proxy(load)


async def _gateway(
    _targets: Sequence[Target], load: Load, _prefix: str
) -> Measurement | Unavailable:
    return await run_gateway(load)


async def _telemetry(
    _targets: Sequence[Target], load: Load, _prefix: str
) -> list[Measurement] | Unavailable:
    return await run_telemetry(load)


async def _middleware(
    _targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement] | Unavailable:
    return await run_middleware(load, prefix)


_Measured = list[Measurement] | list[Measurement | Unavailable] | Measurement | Unavailable
# (the targets, for the scenarios measured on each: sync; one worker's load, which peers
# widens to every --concurrency level; a key prefix)
_Once = Callable[[Sequence[Target], Load, str], Awaitable[_Measured]]
# What the progress bar says while each scenario measured once per bench runs, and the
# function that runs it on one worker (in estimate.ONCE_PER_BENCH's order).
_ONCE_RUNNERS: dict[str, tuple[str, _Once]] = {
    "hasher": ("hasher", _hasher),
    "proxy": ("proxy (mcp)", _proxy),
    "gateway": ("gateway (mcp over http)", _gateway),
    "telemetry": ("telemetry (instrument() overhead)", _telemetry),
    "middleware": ("asgi middleware", _middleware),
    "sync": ("sync runner (idemstore.sync overhead)", run_sync),
    "settle": ("settle in the caller's transaction (vs. commit, then settle)", run_settle),
    "peers": ("peers (idemkit, powertools) on the same servers", run_peers),
    "consumers": ("message consumers (per broker, vs. no idemstore)", run_consumers),
    "cost": ("cost (bytes per record, work per call) on each engine", run_cost),
}


async def _open_floor(target: Target, unavailable: list[Unavailable]) -> Floor | None:
    try:
        floor = floor_for_url(target.url)
        if floor is not None:
            await floor.open()
    except Exception as exc:
        unavailable.append(
            Unavailable(target.name, f"{type(exc).__name__}: {exc}", scenario="floor")
        )
        return None
    return floor


async def _measure(
    target: Target,
    store: IdempotencyStore,
    floor: Floor | None,
    scenario: str,
    load: Load,
    run_id: str,
    result: BenchResult,
) -> list[Measurement]:
    """One store scenario at one concurrency beside its floor; a failure goes to ``result``."""
    prefix = f"{run_id}-{scenario}-c{load.concurrency}:"
    try:
        subject, floor_timing = await run_interleaved(store, floor, scenario, load, prefix)
    except Exception as exc:
        why = f"{scenario} x{load.concurrency} failed: {type(exc).__name__}: {exc}"
        result.unavailable.append(Unavailable(target.name, why, scenario=scenario))
        return []
    return [
        Measurement(
            backend=target.name,
            scenario=scenario,
            concurrency=load.concurrency,
            subject=subject,
            floor=floor_timing,
            floor_name=None if floor is None else floor.name,
            url=redact_url(target.url),
            expected_executions=subject.unique_keys,
        )
    ]


async def _bench_target(
    target: Target,
    config: BenchConfig,
    run_id: str,
    result: BenchResult,
    progress: Progress,
) -> None:
    scenarios = [s for s in config.scenarios if s in STORE_SCENARIOS]
    probes = [s for s in config.scenarios if s in TARGET_PROBES]
    steps = len(scenarios) * len(config.concurrency) + len(probes)
    shown = redact_url(target.url)
    progress.step(f"{target.name}: opening {shown}")
    store: IdempotencyStore | None = None
    try:
        store = open_store(target.url)
        await store.__aenter__()
        if target.migrate:
            await _migrate(store, target.url)
    except Exception as exc:
        result.unavailable.append(_not_opened(target, exc))
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        for _ in range(steps):
            progress.advance()
        return
    floor = await _open_floor(target, result.unavailable)
    try:
        for scenario in scenarios:
            for concurrency in config.concurrency:
                progress.step(f"{target.name} {scenario} x{concurrency}")
                result.measurements += await _measure(
                    target, store, floor, scenario, config.load(concurrency), run_id, result
                )
                progress.advance()
        for probe in probes:
            progress.step(f"{target.name} {probe}")
            try:
                result.measurements += await run_target_probe(
                    probe, store, floor, config.load(1), f"{run_id}-{probe}:", target.name
                )
            except Exception as exc:
                result.unavailable.append(
                    Unavailable(
                        target.name, f"{probe} failed: {type(exc).__name__}: {exc}", scenario=probe
                    )
                )
            progress.advance()
    finally:
        if floor is not None:
            with contextlib.suppress(Exception):
                await floor.close()
        with contextlib.suppress(Exception):
            await store.close()


async def run_bench(
    targets: Sequence[Target],
    config: BenchConfig,
    *,
    unavailable: Sequence[Unavailable] = (),
    progress: Progress | None = None,
) -> BenchResult:
    """Measure every target (store scenarios), then the hashers and the proxy, once each."""
    progress = progress if progress is not None else _SilentProgress()
    result = BenchResult(meta=_meta(), config=config.to_dict(), unavailable=list(unavailable))
    total = step_count(config, len(targets))
    progress.start(total)
    run_id = secrets.token_hex(3)
    started = time.perf_counter()
    for target in targets:
        await _bench_target(target, config, run_id, result, progress)
    one_worker = config.load(1)
    for scenario in ONCE_PER_BENCH:
        if scenario not in config.scenarios:
            continue
        label, run_once = _ONCE_RUNNERS[scenario]
        progress.step(label)
        measured: _Measured
        if scenario == "peers":
            # Its callers per side follow --concurrency, every level on the same open sides.
            measured = await run_peers(
                targets, one_worker, f"{run_id}-{scenario}:", levels=config.concurrency
            )
        else:
            measured = await run_once(targets, one_worker, f"{run_id}-{scenario}:")
        for item in measured if isinstance(measured, list) else [measured]:
            if isinstance(item, Unavailable):
                result.unavailable.append(item)
            else:
                result.measurements.append(item)
        progress.advance()
    result.meta["seconds"] = round(time.perf_counter() - started, 3)
    return result


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="idemstore-bench-") as tmp:
        yield Path(tmp)


async def bench(
    urls: Sequence[str],
    config: BenchConfig,
    *,
    local: bool = False,
    ports: range | None = None,
    progress: Progress | None = None,
) -> BenchResult:
    """The ``idemstore bench`` run: ``urls``; the embedded backends when there are none or
    ``local`` is set; and with ``local``, Redis, PostgreSQL and DynamoDB started for the run
    (on ports from ``ports`` when given)."""
    with _workdir() as tmp:
        targets = name_targets(urls)
        if not urls or local:
            targets = embedded_targets(tmp) + targets
        unavailable: list[Unavailable] = []
        servers: list[Any] = []
        if local:
            if progress is not None:
                progress.step("starting local servers")
            servers, missing = await asyncio.to_thread(
                start_local_servers, tmp / "servers", ports=ports
            )
            unavailable += missing
            targets += [Target(s.backend, s.url, migrate=True) for s in servers]
        try:
            result = await run_bench(targets, config, unavailable=unavailable, progress=progress)
        finally:
            await asyncio.to_thread(stop_local_servers, servers)
        versions = {s.backend: s.version for s in servers if s.version}
        if versions:
            result.meta["servers"] = versions
        return result
