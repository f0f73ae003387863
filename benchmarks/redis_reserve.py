"""Measure the Redis backend's ``reserve`` against a bare ``SET key val NX PX`` floor.

Both run on the same server in the same process with the same redis-py client options, in
alternating batches (so drift on a shared machine hits both alike); latencies are pooled
over all batches. Also reported: Redis commands per operation from ``INFO commandstats``
deltas (top-level EVALSHA vs the commands the script runs inside the server), and how soon a
``wait`` wakes after a ``complete`` on another connection.

    PYTHONPATH=. python benchmarks/redis_reserve.py                # starts a local redis-server
    PYTHONPATH=. python benchmarks/redis_reserve.py --cluster      # ... and a 3-node cluster
    PYTHONPATH=. python benchmarks/redis_reserve.py --url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from idemstore import open_store
from idemstore.backends.redis import RedisStore

Op = Callable[[int], Awaitable[Any]]


async def run(op: Op, total: int, concurrency: int) -> tuple[list[float], float]:
    """Latencies (seconds) of ``total`` calls made by ``concurrency`` tasks, and wall time."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def compare(url: str, *, total: int, rounds: int, concurrency: int) -> dict[str, Any]:
    """p50, p99 (seconds) and ops/s of the floor and of ``reserve``, in alternating batches."""
    store = open_store(url)
    assert isinstance(store, RedisStore)
    async with store:
        client = store._client  # the same redis-py client (pool, options) the store uses
        latencies: dict[str, list[float]] = {"set_nx_px": [], "reserve": []}
        walls: dict[str, float] = {"set_nx_px": 0.0, "reserve": 0.0}
        batch = max(concurrency, total // rounds)
        for round_ in range(rounds):
            run_id = uuid.uuid4().hex[:8]

            async def floor(i: int, run_id: str = run_id) -> None:
                await client.set(f"bench-set:{{{run_id}:{i}}}", b"x", nx=True, px=60_000)

            async def reserve(i: int, run_id: str = run_id) -> None:
                await store.reserve(f"{run_id}:{i}", "fp", lease_ttl=30, retention=60)

            pair = [("set_nx_px", floor), ("reserve", reserve)]
            for name, op in pair if round_ % 2 == 0 else reversed(pair):
                measured, wall = await run(op, batch, concurrency)
                latencies[name] += measured
                walls[name] += wall
        return {
            name: (quantile(values, 0.5), quantile(values, 0.99), len(values) / walls[name])
            for name, values in latencies.items()
        }


def admin_clients(url: str) -> list[Redis]:
    hosts = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return [
        Redis(host=h.rpartition(":")[0], port=int(h.rpartition(":")[2])) for h in hosts.split(",")
    ]


async def commandstats(nodes: list[Redis]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for node in nodes:
        for name, values in (await node.info("commandstats")).items():
            command = name.removeprefix("cmdstat_")
            totals[command] = totals.get(command, 0) + int(values["calls"])
    return totals


async def commands_per_op(url: str, count: int = 1000) -> dict[str, dict[str, float]]:
    nodes = admin_clients(url)
    per_op: dict[str, dict[str, float]] = {}
    async with open_store(url) as store:
        keys = [f"cmd-{uuid.uuid4().hex}" for _ in range(count)]
        # Load the scripts on every node first (a NOSCRIPT fallback is once per node).
        for key in keys[:50]:
            await store.reserve(key + "-warm", "fp", lease_ttl=30, retention=60)
        leases: list[Any] = []

        async def acquire() -> None:
            for key in keys:
                leases.append((await store.reserve(key, "fp", lease_ttl=30, retention=60)).lease)

        async def complete() -> None:
            for lease in leases:
                await store.complete(lease, b"response")

        async def replay() -> None:
            for key in keys:
                await store.reserve(key, "fp", lease_ttl=30, retention=60)

        for name, step in (("reserve", acquire), ("complete", complete), ("replay", replay)):
            before = await commandstats(nodes)
            await step()
            after = await commandstats(nodes)
            delta = {
                k: (after[k] - before.get(k, 0)) / count
                for k in after
                if after[k] != before.get(k, 0) and k not in ("info",)
            }
            per_op[name] = delta
    for node in nodes:
        await node.aclose()
    return per_op


async def wake_latency(url: str, samples: int = 50) -> tuple[float, float]:
    """Milliseconds from a ``complete`` (on another store) to the waiter's return."""
    async with open_store(url) as waiter, open_store(url) as finisher:
        latencies = []
        for _ in range(samples):
            key = f"wake-{uuid.uuid4().hex}"
            lease = (await finisher.reserve(key, "fp", lease_ttl=30, retention=60)).lease
            assert lease is not None
            completed_at = 0.0

            async def finish(lease: Any = lease) -> None:
                nonlocal completed_at
                await asyncio.sleep(0.02)
                completed_at = time.perf_counter()
                await finisher.complete(lease, b"done")

            task = asyncio.create_task(finish())
            await waiter.wait(key, timeout=10)
            latencies.append((time.perf_counter() - completed_at) * 1000)
            await task
        return statistics.median(latencies), max(latencies)


async def report(label: str, url: str, total: int, rounds: int) -> None:
    print(f"\n## {label}\n")
    print("| concurrency | op | p50 µs | p99 µs | ops/s |")
    print("|---|---|---|---|---|")
    for concurrency in (1, 64):
        summary = await compare(url, total=total, rounds=rounds, concurrency=concurrency)
        for name, (p50, p99, rate) in summary.items():
            print(f"| {concurrency} | {name} | {p50 * 1e6:.0f} | {p99 * 1e6:.0f} | {rate:.0f} |")
        floor, ours = summary["set_nx_px"], summary["reserve"]
        print(
            f"| {concurrency} | reserve / floor | {ours[0] / floor[0]:.2f}x | "
            f"{ours[1] / floor[1]:.2f}x | {floor[2] / ours[2]:.2f}x (floor/ours) |"
        )
    print("\nRedis commands per operation (INFO commandstats deltas, averaged):\n")
    for name, delta in (await commands_per_op(url)).items():
        sent = {k: v for k, v in delta.items() if k in ("evalsha", "eval")}
        inside = {k: v for k, v in delta.items() if k not in sent}
        print(f"- {name}: sent {sent}; run inside the script {inside}")
    p50, worst = await wake_latency(url)
    print(f"\n`wait` woken after `complete`: p50 {p50:.2f} ms, max {worst:.2f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="an existing redis:// server (else one is started)")
    parser.add_argument("--cluster", action="store_true", help="also a local 3-node cluster")
    parser.add_argument("--ops", type=int, default=20000, help="operations per kind")
    parser.add_argument("--rounds", type=int, default=40, help="alternating batches")
    args = parser.parse_args()
    servers: list[Any] = []
    try:
        if args.url:
            url = args.url
        else:
            from idemstore.local_servers.redis import start_redis

            servers.append(start_redis())
            url = servers[-1].url
        prefix = f"prefix=bench-{uuid.uuid4().hex[:6]}:"
        await report("redis (single node)", f"{url}?{prefix}", args.ops, args.rounds)
        if args.cluster:
            from idemstore.local_servers.redis import start_redis_cluster

            servers.append(start_redis_cluster())
            await report(
                "redis+cluster (3 primaries)", f"{servers[-1].url}?{prefix}", args.ops, args.rounds
            )
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
