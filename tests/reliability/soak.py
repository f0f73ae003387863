"""Soak: mixed load through ``Idempotency.run`` for minutes on each server engine, sampling
what a long-running service leaks.

    python -m tests.reliability.soak --minutes 10 --workers 64 --out benchmarks/soak

One child process per engine (PostgreSQL, Redis, Redis Cluster, DynamoDB via moto), all at
once, each starting its own engine on loopback from the binaries on PATH. Each child drives
``--workers`` tasks through one store and one runner: new keys, replays of recent keys,
contention on a few hot keys, and work that fails (its key is released). Every few seconds it
samples its own resident memory (RSS, and the part of it malloc holds free for reuse), open
file descriptors, asyncio tasks and the objects the garbage collector tracks, the engine's
count of client connections, and the operations done. Afterwards each series gets a
least-squares slope over the run after warm-up; each series in ``BOUNDS`` must stay within its
bound over the whole run (``REPORTED`` series get a drift, not a verdict); the samples go to
``<out>/<engine>/samples.jsonl``, a summary to ``<out>/summary.json``, and a plot to
``<out>/soak.png``. Exit status 1 when a slope is out of bounds or a run failed.
This is not part of the test command: it runs for minutes by design.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["BOUNDS", "ENGINES", "REPORTED", "fit_slope", "judge"]

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("postgres", "redis", "redis-cluster", "dynamodb")
WARM_UP = 0.2  # the first fifth of a run fills pools and caches: not a leak
# How far each series may drift over the whole run (fitted slope x run length) before it
# counts as a leak. The counts move with the load (heartbeats and waiters come and go, pools
# open and close connections), so a tenth of their mean is noise; a leak of one descriptor,
# task or connection a second drifts by hundreds over ten minutes.
BOUNDS: dict[str, Callable[[float], float]] = {
    # Resident memory in use: RSS less the free memory glibc's malloc keeps for reuse. Free
    # chunks in the middle of the heap stay resident (malloc returns only the top of the heap
    # to the system by itself), so RSS also counts freed memory; a leak stays in use.
    "in_use_mib": lambda mean: max(4.0, 0.05 * mean),
    "open_fds": lambda mean: max(3.0, 0.1 * mean),
    "asyncio_tasks": lambda mean: max(3.0, 0.1 * mean),
    # Python objects the collector tracks: flat while RSS creeps means allocator arenas, not
    # objects kept alive.
    "gc_objects": lambda mean: max(100.0, 0.1 * mean),
    "engine_connections": lambda mean: max(3.0, 0.1 * mean),
}
# Published with their drift but not judged: RSS itself and malloc's free memory, whose sum
# with the memory in use is RSS (a difference here and not in ``in_use_mib`` is freed memory).
REPORTED = ("rss_mib", "malloc_free_mib")


def fit_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t, value)`` points, in value per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def judge(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per series: mean, fitted drift over the run after warm-up, its bound, and a verdict."""
    if not samples:
        return {"ok": False, "why": "no samples"}
    start, end = samples[0]["t"], samples[-1]["t"]
    steady = [s for s in samples if s["t"] >= start + WARM_UP * (end - start)]
    verdicts: dict[str, Any] = {"ok": True, "seconds": round(end - start, 1)}
    for name in (*BOUNDS, *REPORTED):
        points = [(s["t"], float(s[name])) for s in steady if s.get(name) is not None]
        if len(points) < 2:
            continue
        mean = sum(v for _, v in points) / len(points)
        drift = fit_slope(points) * (end - start)
        verdicts[name] = {"mean": round(mean, 2), "drift_over_run": round(drift, 2)}
        if name in BOUNDS:
            bound = BOUNDS[name](mean)
            ok = abs(drift) <= bound
            verdicts[name].update(bound=round(bound, 2), ok=ok)
            verdicts["ok"] = verdicts["ok"] and ok
    verdicts["ops"] = samples[-1]["ops"]
    verdicts["ops_per_second"] = round(samples[-1]["ops"] / max(end - start, 1e-9), 1)
    verdicts["executions"] = samples[-1]["executions"]
    verdicts["errors"] = samples[-1]["errors"]
    verdicts["untyped_errors"] = samples[-1]["untyped_errors"]
    if samples[-1]["untyped_errors"]:
        verdicts["ok"] = False
    return verdicts


# -- one engine (a child process) -------------------------------------------------------------


def _rss_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class _MallInfo2(ctypes.Structure):
    # Declared for the type checker: ctypes gives a c_size_t field as an int.
    fordblks: int
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's mallinfo2 (2.33 and later), or None elsewhere."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


_MALLINFO2 = _mallinfo2()


def _malloc_free_mib() -> float | None:
    """Memory glibc's malloc holds free for reuse (``fordblks``); None without glibc."""
    if _MALLINFO2 is None:
        return None
    return _MALLINFO2().fordblks / 2**20


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _established_to(port: int) -> int:
    """TCP connections of this machine in ESTABLISHED state to 127.0.0.1:``port``."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                remote, state = fields[2], fields[3]
                if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


class _Engine:
    """A started engine: the store URL on it, how to count its client connections, and how
    to stop it."""

    def __init__(
        self, url: str, connections: Callable[[], Awaitable[int]], stop: Callable[[], None]
    ) -> None:
        self.url = url
        self.connections = connections
        self.stop = stop


def _redis_clients(nodes: list[Any]) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        total = 0
        for node in nodes:
            info = await asyncio.to_thread(node.cli, "INFO", "clients")
            for line in info.splitlines():
                if line.startswith("connected_clients:"):
                    total += int(line.split(":", 1)[1]) - 1  # redis-cli itself
        return total

    return count


def _start_engine(engine: str, where: Path) -> _Engine:
    if engine == "postgres":
        from idemstore.local_servers.postgres import start_postgres

        server = start_postgres()

        async def backends() -> int:
            import asyncpg

            connection = await asyncpg.connect(server.url)
            try:
                count: int = await connection.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                )
            finally:
                await connection.close()
            return count

        return _Engine(f"{server.url}?schema=soak&auto_migrate=true", backends, server.stop)
    if engine == "redis":
        from idemstore.local_servers.redis import start_redis

        redis = start_redis(directory=where)
        return _Engine(redis.url, _redis_clients([redis]), redis.stop)
    if engine == "redis-cluster":
        from idemstore.local_servers.redis import start_redis_cluster

        cluster = start_redis_cluster()
        return _Engine(cluster.url, _redis_clients(cluster.nodes), cluster.stop)
    if engine == "dynamodb":
        from urllib.parse import urlsplit

        from idemstore.local_servers.dynamodb import start_dynamodb

        os.environ.update(
            {
                "AWS_ACCESS_KEY_ID": "soak",
                "AWS_SECRET_ACCESS_KEY": "soak",
                "AWS_CONFIG_FILE": "/dev/null",
            }
        )
        moto = start_dynamodb(where)
        port = urlsplit(moto.url).port or 80

        async def sockets() -> int:
            return _established_to(port)

        url = f"dynamodb://idemstore_soak?region=us-east-1&auto_create=true&endpoint_url={moto.url}"
        return _Engine(url, sockets, moto.stop)
    raise SystemExit(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


class _Load:
    """Counters the workers share, and the mix of calls they make."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ops = 0
        self.executions = 0
        self.errors = 0
        self.untyped_errors = 0
        self.next_key = 0
        self.recent: list[str] = []

    def pick(self) -> str:
        roll = self.rng.random()
        if roll < 0.5 or not self.recent:
            self.next_key += 1
            key = f"k{self.next_key}"
            self.recent.append(key)
            if len(self.recent) > 2000:
                del self.recent[:1000]
            return key
        if roll < 0.8:
            return self.rng.choice(self.recent)  # a retry: replays
        return f"hot{self.rng.randrange(8)}-{self.next_key // 500}"  # contention


async def _drive(engine: _Engine, workers: int, seconds: float, every: float, out: Path) -> None:
    from idemstore import Idempotency, IdemstoreError, open_store

    load = _Load(seed=len(out.name))
    deadline = time.monotonic() + seconds
    async with open_store(engine.url) as store:
        idem = Idempotency(store, lease_ttl=5, retention=120, wait_timeout=10)

        async def worker() -> None:
            while time.monotonic() < deadline:
                key = load.pick()

                async def work() -> bytes:
                    load.executions += 1
                    await asyncio.sleep(load.rng.random() * 0.005)
                    if load.rng.random() < 0.05:
                        raise RuntimeError("the work failed")  # the key is released
                    return b"x" * load.rng.randrange(16, 2048)

                try:
                    await idem.run(key, "soak", work)
                except RuntimeError:
                    pass
                except IdemstoreError:
                    load.errors += 1
                except Exception:
                    load.untyped_errors += 1
                load.ops += 1

        async def sample(log: Any, started: float) -> None:
            while True:
                rss, free = _rss_mib(), _malloc_free_mib()
                row = {
                    "t": round(time.monotonic() - started, 2),
                    "rss_mib": round(rss, 2),
                    "malloc_free_mib": None if free is None else round(free, 2),
                    # Without glibc, RSS itself is held to the bound.
                    "in_use_mib": round(rss - (free or 0.0), 2),
                    "open_fds": _open_fds(),
                    "asyncio_tasks": len(asyncio.all_tasks()),
                    "gc_objects": len(gc.get_objects()),
                    "engine_connections": await engine.connections(),
                    "ops": load.ops,
                    "executions": load.executions,
                    "errors": load.errors,
                    "untyped_errors": load.untyped_errors,
                }
                log.write(json.dumps(row) + "\n")
                log.flush()
                # The last sample is taken while every worker still runs: the wind-down
                # after the deadline is not part of the steady state.
                if time.monotonic() + every >= deadline:
                    return
                await asyncio.sleep(every)

        started = time.monotonic()
        with (out / "samples.jsonl").open("w", encoding="utf-8") as log:
            sampler = asyncio.create_task(sample(log, started))
            await asyncio.gather(*(worker() for _ in range(workers)))
            await sampler


def _child(args: argparse.Namespace) -> int:
    out = Path(args.out) / args.child
    out.mkdir(parents=True, exist_ok=True)
    engine = _start_engine(args.child, out)
    try:
        asyncio.run(_drive(engine, args.workers, args.minutes * 60, args.every, out))
    finally:
        engine.stop()
    return 0


# -- the parent: one child per engine, then the verdicts and the plot -------------------------


def _plot(results: dict[str, list[dict[str, Any]]], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [*BOUNDS, "rss_mib"]
    figure, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.4))
    for axis, name in zip(axes, series, strict=True):
        for engine, samples in results.items():
            axis.plot(
                [s["t"] / 60 for s in samples], [s[name] for s in samples], label=engine, lw=1.2
            )
        axis.set_title(name.replace("_", " "))
        axis.set_xlabel("minutes")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", default="benchmarks/soak")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = {
        engine: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.soak",
                "--child",
                engine,
                "--minutes",
                str(args.minutes),
                "--workers",
                str(args.workers),
                "--every",
                str(args.every),
                "--out",
                str(out),
            ],
            cwd=ROOT,
            env=env,
        )
        for engine in args.engines
    }
    results: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, Any] = {
        "minutes": args.minutes,
        "workers": args.workers,
        "sample_every_s": args.every,
        "warm_up_share": WARM_UP,
    }
    ok = True
    for engine, child in children.items():
        code = child.wait()
        path = out / engine / "samples.jsonl"
        samples = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        results[engine] = samples
        verdict = judge(samples)
        verdict["exit_code"] = code
        verdict["ok"] = verdict.get("ok", False) and code == 0
        summary[engine] = verdict
        ok = ok and verdict["ok"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(results, out / "soak.png")
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
