"""The ``gateway`` bench scenario: what ``idemstore gateway`` adds to a Streamable HTTP call.

One run starts the mock HTTP MCP endpoint (``idemstore.bench.mock_http_server``), an
``idemstore gateway`` in front of it (memory store) and, as the floor, a bare streaming reverse
proxy on the gateway's own stack (``idemstore.bench.reverse_proxy``: uvicorn, Starlette, httpx,
bytes forwarded unread), all on loopback. It times the same ``tools/call`` requests (fresh
arguments each: through the gateway every one reserves, runs and completes a derived key) sent
directly, through the bare proxy and through the gateway, over one pooled httpx connection
each, one at a time, the three interleaved (in duration mode each side makes at least
``MIN_SAMPLES`` calls, so its p99 rests on 20 of them). The added latency is the difference of the
percentiles; the gateway's p50 and p99 added are compared with the bare proxy's. Then
``IDENTICAL_CALLS`` identical calls go through the gateway and the upstream's executions are
counted: 1 is right. Last, ``PASS_THROUGH_CALLS`` requests that are not ``tools/call`` (a
``resources/read`` carrying the payload) go through the gateway with and without SEP-2243's
``Mcp-Method`` header, interleaved: with it the gateway relays them without parsing the body,
and the notes give both medians (``pass_through_*``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.bench.results import Timing, Unavailable, added_latency, ratio, through_layer
from idemstore.bench.scenarios import checkout_env
from idemstore.local_servers import free_port, wait_for_port

if TYPE_CHECKING:
    from idemstore.bench.results import Measurement

__all__ = ["run_gateway"]

GATEWAY_STORE = "memory://"
IDENTICAL_CALLS = 5
# Pass-through requests per side in duration mode (with --ops, that many).
PASS_THROUGH_CALLS = 1000
# Rounds of direct, bare proxy, gateway: drift on a shared machine spreads over all three.
ROUNDS = 4
# In duration mode, calls each side makes at the least: the p99 compared with the bare proxy's
# must rest on more than its few slowest calls (a second at 3 ms a call gives ~300, whose p99
# is the third slowest, and moved the ratio from 1.46 to 1.65 between two runs).
MIN_SAMPLES = 2000
START_TIMEOUT = 30.0
RPC_TIMEOUT = 30.0
# One caller, as the gateway tells them apart: a request with no credentials is not deduplicated.
_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "authorization": "Bearer bench-caller",
}


def _spawn(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *argv],
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _listening(process: subprocess.Popen[bytes], port: int) -> None:
    """Return once ``port`` accepts connections; ``ServerUnavailableError`` if it never does."""
    await asyncio.to_thread(wait_for_port, port, process=process, timeout=START_TIMEOUT)


async def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


async def _time_calls(
    client: Any, url: str, ops: int | None, duration: float | None, pad: str, at_least: int = 0
) -> Timing:
    """Time ``ops`` calls, or calls for ``duration`` seconds and at least ``at_least`` of them."""
    timing = Timing()
    clock = time.perf_counter_ns
    deadline = None if duration is None else time.monotonic() + duration
    j = 0
    started = time.perf_counter()
    while (
        (j < ops)
        if ops is not None
        else (j < at_least or (deadline is not None and time.monotonic() < deadline))
    ):
        body = {
            "jsonrpc": "2.0",
            "id": j + 1,
            "method": "tools/call",
            "params": {"name": "record", "arguments": {"n": j, "pad": pad}},
        }
        begun = clock()
        try:
            response = await client.post(url, json=body, headers=_HEADERS)
            answer = response.json()
            if response.status_code != 200 or "result" not in answer:
                raise RuntimeError(f"tools/call failed: {response.status_code} {answer}")
        except Exception as exc:
            timing.record_error(exc)
        else:
            timing.latencies_ns.append(clock() - begun)
        j += 1
    timing.seconds = time.perf_counter() - started
    return timing


async def _time_pass_through(
    client: Any, url: str, pad: str, calls: int
) -> dict[str, float | None]:
    """Median milliseconds of a non-``tools/call`` request through the gateway, relayed by
    its ``Mcp-Method`` header (body unread) and without it (body parsed)."""
    import json

    params = {"uri": "file:///bench", "_meta": {"pad": pad}}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": params})
    sides = {"parsed": _HEADERS, "by_header": {**_HEADERS, "mcp-method": "resources/read"}}
    latencies: dict[str, list[int]] = {name: [] for name in sides}
    for _ in range(ROUNDS):
        for name, headers in sides.items():
            for _ in range(max(1, calls // ROUNDS)):
                begun = time.perf_counter_ns()
                await client.post(url, content=body, headers=headers)
                latencies[name].append(time.perf_counter_ns() - begun)
    return {
        f"pass_through_{name}_p50_ms": sorted(v)[len(v) // 2] / 1e6 for name, v in latencies.items()
    }


def _added(through: Timing, direct: Timing, relay: Timing) -> dict[str, float | None]:
    """Added latency of the gateway and of the bare proxy, and the gateway's over the proxy's."""
    ours, bare = added_latency(through, direct), added_latency(relay, direct, "relay_")
    return {
        **bare,
        "relay_x_added_p50": ratio(ours.get("added_p50_ms"), bare.get("relay_added_p50_ms")),
        "relay_x_added_p99": ratio(ours.get("added_p99_ms"), bare.get("relay_added_p99_ms")),
    }


async def _measure(
    load: Any, tmp: Path
) -> tuple[Timing, Timing, Timing, int, dict[str, float | None]]:
    import httpx

    counter = tmp / "executions"
    counter.touch()
    upstream_port, gateway_port, relay_port = free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    upstream = _spawn(
        "-m", "idemstore.bench.mock_http_server", "--port", str(upstream_port),
        "--counter", str(counter),
    )  # fmt: skip
    gateway = _spawn(
        "-m", "idemstore", "gateway", "--listen", f"127.0.0.1:{gateway_port}",
        "--upstream", upstream_url, "--store", GATEWAY_STORE,
    )  # fmt: skip
    relay = _spawn(
        "-m", "idemstore.bench.reverse_proxy", "--port", str(relay_port),
        "--upstream", upstream_url,
    )  # fmt: skip
    gateway_url = f"http://127.0.0.1:{gateway_port}/mcp"
    relay_url = f"http://127.0.0.1:{relay_port}/mcp"
    pad = "x" * load.payload_bytes
    try:
        await _listening(upstream, upstream_port)
        await _listening(gateway, gateway_port)
        await _listening(relay, relay_port)
        timeout = httpx.Timeout(RPC_TIMEOUT)
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            # One untimed call each way: connections open, imports settle.
            await _time_calls(client, upstream_url, 1, None, "warm")
            await _time_calls(client, gateway_url, 1, None, "warm")
            await _time_calls(client, relay_url, 1, None, "warm")
            # Interleave rounds so that drift on a shared machine lands on every side.
            part = None if load.ops is None else max(1, load.ops // ROUNDS)
            span = None if load.duration is None else load.duration / (2 * ROUNDS)
            at_least = MIN_SAMPLES // ROUNDS
            direct, relayed, through = Timing(), Timing(), Timing()
            sides = ((direct, upstream_url), (relayed, relay_url), (through, gateway_url))
            for _ in range(ROUNDS):
                for timing, url in sides:
                    done = await _time_calls(client, url, part, span, pad, at_least)
                    timing.latencies_ns += done.latencies_ns
                    timing.seconds += done.seconds
                    for name, count in done.errors.items():
                        timing.errors[name] = timing.errors.get(name, 0) + count
            before = len(counter.read_text().split())
            body = {
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "record", "arguments": {"n": "identical"}},
            }
            for i in range(IDENTICAL_CALLS):
                await client.post(gateway_url, json={**body, "id": f"same-{i}"}, headers=_HEADERS)
            executions = len(counter.read_text().split()) - before
            calls = load.ops if load.ops is not None else PASS_THROUGH_CALLS
            pass_through = await _time_pass_through(client, gateway_url, pad, calls)
    finally:
        await _stop(relay)
        await _stop(gateway)
        await _stop(upstream)
    return through, direct, relayed, executions, pass_through


async def run_gateway(load: Any) -> Measurement | Unavailable:
    """``tools/call`` through ``idemstore gateway`` (memory store) against the upstream direct."""
    for module in ("httpx", "starlette", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            why = f"{module} is not installed"
            return Unavailable("mcp gateway", why, scenario="gateway", extra="gateway")
    try:
        with tempfile.TemporaryDirectory(prefix="idemstore-bench-gateway-") as tmp:
            through, direct, relayed, executions, pass_through = await _measure(load, Path(tmp))
    except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
        return Unavailable("mcp gateway", f"{type(exc).__name__}: {exc}", scenario="gateway")
    through.executions = executions
    through.unique_keys = 1
    return through_layer(
        "gateway",
        through,
        direct,
        direct_name="the same HTTP endpoint called directly",
        store=GATEWAY_STORE,
        notes={
            "identical_calls": IDENTICAL_CALLS,
            **_added(through, direct, relayed),
            **pass_through,
        },
    )
