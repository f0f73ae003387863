"""Added latency of ``idemstore proxy`` and the duplicate count it prevents (not a test).

Runs the mock MCP server of the test suite twice in one run: directly, and behind the proxy
(memory store by default). Calls alternate between the two so both see the same machine load.

    PYTHONPATH=. python benchmarks/mcp_proxy.py [--calls 2000] [--store memory://]

Prints a Markdown report: round-trip p50/p99 of a first-time tools/call direct and proxied,
the added latency, the latency of a replay, and how many of 5 identical calls executed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MOCK_SERVER = ROOT / "tests" / "mcp" / "mock_server.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Peer:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.next_id = 0

    @classmethod
    async def start(cls, command: list[str]) -> Peer:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=ENV
        )
        return cls(process)

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """One tools/call round trip: (seconds, response)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.next_id += 1
        params = {"name": name, "arguments": arguments}
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": params}
        data = json.dumps(message).encode() + b"\n"
        started = time.perf_counter()
        self.process.stdin.write(data)
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        elapsed = time.perf_counter() - started
        response: dict[str, Any] = json.loads(line)
        assert response["id"] == self.next_id, response
        return elapsed, response

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), 30)


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


async def _duplicates(command: list[str], counter: Path) -> int:
    peer = await Peer.start(command)
    for _ in range(5):
        await peer.call("charge", {"amount": 4200, "card": "tok_visa"})
    await peer.close()
    return _count(counter)


def _count(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


async def main(calls: int, store: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        direct_counter = Path(scratch, "direct.jsonl")
        proxied_counter = Path(scratch, "proxied.jsonl")
        mock = [sys.executable, str(MOCK_SERVER)]
        proxy = [sys.executable, "-m", "idemstore", "proxy", "--store", store, "--"]

        direct = await Peer.start(mock)
        proxied = await Peer.start([*proxy, *mock])
        relayed = await Peer.start([*proxy[:-1], "--no-implicit", "--", *mock])
        for i in range(200):  # warm up every path (imports, allocator, page cache)
            for peer in (direct, proxied, relayed):
                await peer.call("charge", {"amount": -i})
        direct_times: list[float] = []
        proxied_times: list[float] = []
        relayed_times: list[float] = []
        for i in range(calls):
            arguments = {"amount": i, "currency": "usd"}  # new arguments: never a replay
            direct_times.append((await direct.call("charge", arguments))[0])
            proxied_times.append((await proxied.call("charge", arguments))[0])
            relayed_times.append((await relayed.call("charge", arguments))[0])
        replay_times = [
            (await proxied.call("charge", {"amount": i % 100, "currency": "usd"}))[0]
            for i in range(calls)
        ]
        for peer in (direct, proxied, relayed):
            await peer.close()

        direct_runs = await _duplicates([*mock, "--counter", str(direct_counter)], direct_counter)
        proxied_runs = await _duplicates(
            [*proxy, *mock, "--counter", str(proxied_counter)], proxied_counter
        )

    d50, d99 = _quantile(direct_times, 0.5), _quantile(direct_times, 0.99)
    p50, p99 = _quantile(proxied_times, 0.5), _quantile(proxied_times, 0.99)
    added = [p - d for p, d in zip(proxied_times, direct_times, strict=True)]
    print(f"## MCP proxy: added latency and duplicates ({calls} calls each, store {store})\n")
    print(f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()},")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs (load average {load}); stdio pipes; tests/mcp/mock_server.py.\n")
    print("| path | p50 | p99 | mean |")
    print("|---|---|---|---|")
    print(f"| direct | {_ms(d50)} | {_ms(d99)} | {_ms(statistics.fmean(direct_times))} |")
    print(
        f"| through the proxy (first call) | {_ms(p50)} | {_ms(p99)} |"
        f" {_ms(statistics.fmean(proxied_times))} |"
    )
    print(
        f"| through the proxy, relayed without a key (`--no-implicit`) |"
        f" {_ms(_quantile(relayed_times, 0.5))} | {_ms(_quantile(relayed_times, 0.99))} |"
        f" {_ms(statistics.fmean(relayed_times))} |"
    )
    print(
        f"| through the proxy (replay) | {_ms(_quantile(replay_times, 0.5))} |"
        f" {_ms(_quantile(replay_times, 0.99))} | {_ms(statistics.fmean(replay_times))} |"
    )
    print(
        f"| added by the proxy (paired difference) | {_ms(_quantile(added, 0.5))} |"
        f" {_ms(_quantile(added, 0.99))} | {_ms(statistics.fmean(added))} |"
    )
    print()
    print("| 5 identical `charge` calls | executions | duplicates |")
    print("|---|---|---|")
    for path, runs in (("direct", direct_runs), ("through the proxy", proxied_runs)):
        print(f"| {path} | {runs} | {runs - 1} ({(runs - 1) / 5:.0%}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--store", default="memory://")
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.store))
