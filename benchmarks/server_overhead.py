"""Per-request overhead of the SEP-3182 MCP middleware and the HTTP Idempotency-Key middleware.

Each server runs in-process twice, identical but for the middleware, over the memory store,
in one run: the MCP servers through the real ``mcp`` client (2026-07-28 in-process path), the
HTTP app through ``httpx.ASGITransport``. Reported: median and p99 latency per request and the
median's difference from the same server without the middleware.

    PYTHONPATH=. /work/venv/bin/python benchmarks/server_overhead.py [--requests 2000]

Not a test: numbers depend on the machine. Cases:
  baseline     no middleware, no key
  no key       middleware installed, request without a key (pass-through cost)
  first run    middleware, a new key per request (reserve + execute + complete)
  replay       middleware, the same key again (reserve finds the record, no execution)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx
from mcp import Client
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from idemstore import open_store
from idemstore.asgi import IdempotencyMiddleware
from tests.mcp_server.conftest import call
from tests.mcp_server.servers import Tools, fastmcp_server, lowlevel_server

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.requests import Request


async def measure(
    n: int, cases: dict[str, Callable[[int], Awaitable[Any]]]
) -> dict[str, list[float]]:
    """Time ``n`` requests of every case, interleaved round-robin so that load from anything
    else on the machine falls on all cases alike."""
    for i in range(min(200, n)):  # warm-up
        for one in cases.values():
            await one(-1 - i)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(n):
        for name, one in cases.items():
            start = time.perf_counter()
            await one(i)
            samples[name].append((time.perf_counter() - start) * 1e6)
    return samples


def rows(prefix: str, samples: dict[str, list[float]]) -> list[str]:
    baseline = statistics.median(samples["baseline"])
    lines = []
    for name, values in samples.items():
        median = statistics.median(values)
        p99 = statistics.quantiles(values, n=100)[98]
        extra = "" if name == "baseline" else f"{median - baseline:+.0f}"
        lines.append(f"| {prefix}: {name} | {median:.0f} | {p99:.0f} | {extra} |")
    return lines


async def bench_mcp(adapter: str, n: int) -> list[str]:
    build = lowlevel_server if adapter == "lowlevel" else fastmcp_server
    async with open_store("memory://") as store:
        plain = build(Tools(), store)
        # The same server without the middleware: drop it from the list it was added to.
        plain.middleware.pop()  # type: ignore[union-attr]
        with_mw = build(Tools(), store)
        plain_server = plain if adapter == "lowlevel" else plain._mcp_server  # type: ignore[union-attr]
        with_server = with_mw if adapter == "lowlevel" else with_mw._mcp_server  # type: ignore[union-attr]
        run = uuid.uuid4().hex[:8]
        args = {"amount": 5}
        async with Client(plain_server) as base, Client(with_server) as client:
            await call(client, "charge", args, key=f"{run}-replay")
            samples = await measure(
                n,
                {
                    "baseline": lambda i: call(base, "charge", args),
                    "no key": lambda i: call(client, "charge", args),
                    "first run": lambda i: call(client, "charge", args, key=f"{run}-{i}"),
                    "replay": lambda i: call(client, "charge", args, key=f"{run}-replay"),
                },
            )
    return rows(f"MCP {adapter}", samples)


async def create(request: Request) -> Response:
    order = await request.json()
    return JSONResponse({"id": 1, "order": order}, status_code=201)


async def bench_http(n: int) -> list[str]:
    async with open_store("memory://") as store:
        plain = Starlette(routes=[Route("/orders", create, methods=["POST"])])
        app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
        app.add_middleware(IdempotencyMiddleware, store=store)
        body = {"sku": "A1", "qty": 2, "note": "x" * 200}
        auth = {"Authorization": "Bearer bench"}
        run = uuid.uuid4().hex[:8]
        replay = {**auth, "Idempotency-Key": f'"{run}-replay"'}
        base_transport = httpx.ASGITransport(app=plain)
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=base_transport, base_url="http://b") as base,
            httpx.AsyncClient(transport=transport, base_url="http://b") as client,
        ):
            await client.post("/orders", json=body, headers=replay)
            samples = await measure(
                n,
                {
                    "baseline": lambda i: base.post("/orders", json=body, headers=auth),
                    "no key": lambda i: client.post("/orders", json=body, headers=auth),
                    "first run": lambda i: client.post(
                        "/orders", json=body, headers={**auth, "Idempotency-Key": f'"{run}-{i}"'}
                    ),
                    "replay": lambda i: client.post("/orders", json=body, headers=replay),
                },
            )
    return rows("HTTP Starlette", samples)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    n = parser.parse_args().requests
    lines = [
        f"{n} sequential requests per case, memory store, Python {sys.version.split()[0]}",
        "",
        "| case | median µs | p99 µs | median overhead µs |",
        "|---|---:|---:|---:|",
    ]
    for adapter in ("lowlevel", "fastmcp"):
        lines += await bench_mcp(adapter, n)
    lines += await bench_http(n)
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
