"""The scenarios ``idemstore bench`` runs, and the timed loop they share.

Store scenarios (``fresh``, ``replay``, ``contention``, ``mixed``) differ only in which keys
their workers use; each operation is what ``Idempotency.run`` does on the store: ``reserve``,
then ``complete`` when the key was acquired. ``reserve`` is ``fresh`` without the ``complete``:
the claim alone, the operation the floor's one insert-if-absent compares with. The engine's
floor runs the same key sequence with its bare insert-if-absent, so backend and floor see the
same shape of load.

``hasher`` times ``idemstore.fingerprint`` against ``rfc8785`` and ``json.dumps(sort_keys=True)``
on one value; ``proxy`` times ``tools/call`` through ``idemstore proxy`` against the same mock
MCP server called directly, and counts executions of 5 identical calls both ways.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.bench.results import (
    Measurement,
    Timing,
    Unavailable,
    added_latency,
    through_layer,
)
from idemstore.hashing import fingerprint

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from idemstore.bench.floors import Floor
    from idemstore.protocol import IdempotencyStore

__all__ = [
    "SCENARIOS",
    "STORE_SCENARIOS",
    "TARGET_PROBES",
    "Load",
    "merge",
    "run_floor",
    "run_interleaved",
    "keep_going",
    "run_proxy",
    "run_store",
]

STORE_SCENARIOS: tuple[str, ...] = ("fresh", "reserve", "replay", "contention", "mixed")
# Probes (probes.py): what a store costs besides latency; "middleware" runs once per bench.
TARGET_PROBES: tuple[str, ...] = ("commands", "wake", "replay-writes", "replay-cache")
# hasher, gateway, telemetry, sync and peers live in modules of their own (hasher_scenario.py,
# ...); peers runs by default only where a peer package is installed (peers_scenario.py).
SCENARIOS: tuple[str, ...] = (
    *STORE_SCENARIOS,
    "hasher",
    "proxy",
    *TARGET_PROBES,
    "middleware",
    "gateway",
    "telemetry",
    "sync",
    "settle",
    "peers",
    "consumers",
    "cost",
)
# Run only when named (--scenario consumers, --scenario cost): consumers starts message brokers,
# which a default run (the README's first command) must not need, and cost measures what a
# record costs an engine, for `idemstore plan`, not how fast it answers.
ON_REQUEST: tuple[str, ...] = ("consumers", "cost")

# Every bench record lives in this scope, under keys unique to the run, so a bench against a
# real store never touches its records; they expire after RETENTION.
SCOPE = "idemstore-bench"
LEASE_TTL = 30.0
RETENTION = 3600.0
# One fingerprint for every key: a retry sends the same arguments, and hashing is timed apart.
FINGERPRINT = fingerprint({"idemstore": "bench"})

# replay: completed keys the workers cycle over (written before the clock starts).
REPLAY_KEYS = 256
# contention: every worker walks the same keys, each this many times in a row, so all workers
# race on the first touch of a key and then replay it.
CONTENTION_REPEATS = 8
# mixed: share of operations that retry a key the worker already completed.
RETRY_SHARE = 0.2

# Store and floor alternate at least this many times per measurement (see run_interleaved),
# and in timed measurements at least once every ROUND_SECONDS: the speed of a shared VM
# drifts within seconds, and finer alternation spreads the drift over both sides.
ROUNDS = 4
ROUND_SECONDS = 0.25

IDENTICAL_CALLS = 5  # proxy: identical calls whose executions are counted
RPC_TIMEOUT = 30.0  # proxy: seconds to wait for one JSON-RPC answer


@dataclass(frozen=True, slots=True)
class Load:
    """The shape of one measurement: ``ops`` operations in all, or ``duration`` seconds, over
    ``concurrency`` asyncio workers, with responses of ``payload_bytes``."""

    concurrency: int
    ops: int | None
    duration: float | None
    payload_bytes: int

    def per_worker(self) -> list[int | None]:
        """Operations per worker (``None``: until the deadline)."""
        if self.ops is None:
            return [None] * self.concurrency
        base, extra = divmod(self.ops, self.concurrency)
        return [base + (1 if worker < extra else 0) for worker in range(self.concurrency)]


def payload(size: int) -> bytes:
    """A response of ``size`` bytes that does not compress to nothing."""
    rng = random.Random(size)
    return bytes(rng.randrange(32, 127) for _ in range(size))


class _KeyPlan:
    """Which key operation ``j`` of worker ``w`` uses, and which keys exist before timing."""

    __slots__ = ("_done", "_rng", "preload", "scenario")

    def __init__(self, scenario: str, load: Load) -> None:
        if scenario not in STORE_SCENARIOS:
            raise ValueError(f"not a store scenario: {scenario!r}")
        self.scenario = scenario
        self.preload: list[str] = []
        if scenario == "replay":
            count = REPLAY_KEYS if load.ops is None else max(1, min(REPLAY_KEYS, load.ops))
            self.preload = [f"replay-{i}" for i in range(count)]
        self._rng = [random.Random(worker) for worker in range(load.concurrency)]
        self._done: list[list[str]] = [[] for _ in range(load.concurrency)]

    def key(self, worker: int, j: int) -> str:
        if self.scenario in ("fresh", "reserve"):
            return f"{self.scenario}-{worker}-{j}"
        if self.scenario == "replay":
            # Workers start at different keys, as independent clients would.
            return self.preload[(worker * 7919 + j) % len(self.preload)]
        if self.scenario == "contention":
            return f"contended-{j // CONTENTION_REPEATS}"
        done = self._done[worker]
        if done and self._rng[worker].random() < RETRY_SHARE:
            return self._rng[worker].choice(done)
        key = f"mixed-{worker}-{j}"
        done.append(key)
        return key


def merge(timings: Sequence[Timing]) -> Timing:
    """One timing from several rounds of the same loop: samples pooled, counts added."""
    merged = Timing()
    for timing in timings:
        merged.latencies_ns += timing.latencies_ns
        merged.seconds += timing.seconds
        merged.executions += timing.executions
        merged.unique_keys += timing.unique_keys
        for name, n in timing.errors.items():
            merged.errors[name] = merged.errors.get(name, 0) + n
        for name, text in timing.error_examples.items():
            merged.error_examples.setdefault(name, text)
        for name, n in timing.outcomes.items():
            merged.outcomes[name] = merged.outcomes.get(name, 0) + n
    return merged


def rounds_of(load: Load) -> list[Load]:
    """``load`` cut into ``ROUNDS`` rounds (fewer when there are too few operations; in a
    timed measurement, more when it lasts longer than ``ROUNDS * ROUND_SECONDS``)."""
    if load.ops is None:
        assert load.duration is not None
        count = max(ROUNDS, round(load.duration / ROUND_SECONDS))
        return [replace(load, duration=load.duration / count)] * count
    count = max(1, min(ROUNDS, load.ops // max(1, load.concurrency)))
    base, extra = divmod(load.ops, count)
    return [replace(load, ops=base + (1 if r < extra else 0)) for r in range(count)]


async def run_interleaved(
    store: IdempotencyStore, floor: Floor | None, scenario: str, load: Load, prefix: str
) -> tuple[Timing, Timing | None]:
    """``scenario`` on the store and on its floor in alternating rounds, samples pooled.

    Alternating keeps the ratio honest on a shared machine: a burst of load from elsewhere
    lands on both sides instead of on whichever happened to run then.
    """
    if floor is not None:
        await floor.reset()
    subject: list[Timing] = []
    floors: list[Timing] = []
    for r, part in enumerate(rounds_of(load)):
        # Which side goes first alternates too, so neither always runs on the other's heels.
        if floor is not None and r % 2 == 0:
            floors.append(await run_floor(floor, scenario, part, f"{prefix}r{r}:", reset=False))
        subject.append(await run_store(store, scenario, part, f"{prefix}r{r}:"))
        if floor is not None and r % 2 == 1:
            floors.append(await run_floor(floor, scenario, part, f"{prefix}r{r}:", reset=False))
    return merge(subject), (merge(floors) if floor is not None else None)


def keep_going(done: int, count: int | None, deadline: float | None) -> bool:
    """Whether a worker goes on: fewer than ``count`` done, or (no count) before ``deadline``."""
    if count is not None:
        return done < count
    return deadline is not None and time.monotonic() < deadline


async def _drive(
    op: Callable[[str], Awaitable[bool]],
    scenario: str,
    load: Load,
    prefix: str,
    outcomes: dict[str, int],
) -> Timing:
    """Run ``op`` (``True`` when it executed the work) over ``scenario``'s keys, timed.

    ``op`` tallies outcomes in ``outcomes``, which is emptied when the clock starts so that
    preloading and warm-up do not count.
    """
    plan = _KeyPlan(scenario, load)
    timing = Timing()
    preloaded = {prefix + key for key in plan.preload}
    for key in sorted(preloaded):
        await op(key)
    # One untimed operation per worker first: pools open their connections, caches fill.
    await asyncio.gather(
        *(op(f"{prefix}warm-{worker}") for worker in range(load.concurrency)),
        return_exceptions=True,
    )
    outcomes.clear()
    touched: set[str] = set()
    deadline = None if load.duration is None else time.monotonic() + load.duration

    async def worker(index: int, count: int | None) -> None:
        j = 0
        while keep_going(j, count, deadline):
            key = prefix + plan.key(index, j)
            touched.add(key)
            await timing.time_call(op(key))
            j += 1
            # Let the other workers in, even when the store answered without awaiting (memory):
            # otherwise workers would run one after another and never race.
            await asyncio.sleep(0)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i, n) for i, n in enumerate(load.per_worker())))
    timing.seconds = time.perf_counter() - started
    timing.unique_keys = len(touched - preloaded)
    # str(): a store's tally is keyed by its Outcome members (equal to their values).
    timing.outcomes = {str(name): n for name, n in outcomes.items()}
    return timing


async def run_store(store: IdempotencyStore, scenario: str, load: Load, prefix: str) -> Timing:
    """One store scenario: ``reserve``, then ``complete`` when acquired (but in ``reserve``,
    which times the claim alone against the floor's one insert)."""
    response = payload(load.payload_bytes)
    outcomes: dict[str, int] = {}
    claim_only = scenario == "reserve"

    async def op(key: str) -> bool:
        reservation = await store.reserve(
            key, FINGERPRINT, scope=SCOPE, lease_ttl=LEASE_TTL, retention=RETENTION
        )
        # The member itself, not ``.value`` (an enum property, slower than the store's own
        # dict insert): the timed region should hold the store's work, not the tally's.
        outcome = reservation.outcome
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if reservation.lease is None:
            return False
        if claim_only:
            return True
        if not await store.complete(reservation.lease, response):
            outcomes["fenced_out"] = outcomes.get("fenced_out", 0) + 1
        return True

    return await _drive(op, scenario, load, prefix, outcomes)


async def run_floor(
    floor: Floor, scenario: str, load: Load, prefix: str, *, reset: bool = True
) -> Timing:
    """The same scenario on the engine's floor: an insert-if-absent per operation, followed
    by the bare overwrite ``finish`` where the store completes what it claimed."""
    value = payload(load.payload_bytes)
    if reset:
        await floor.reset()
    outcomes: dict[str, int] = {}

    claim_only = scenario == "reserve"

    async def op(key: str) -> bool:
        inserted = await floor.put(key, value)
        outcome = "inserted" if inserted else "present"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if inserted and not claim_only:
            await floor.finish(key, value)  # what complete is to the store
        return inserted

    return await _drive(op, scenario, load, prefix, outcomes)


# -- proxy -----------------------------------------------------------------------------------

PROXY_MODULE = "idemstore.mcp.proxy"
PROXY_STORE = "memory://"


def checkout_env() -> dict[str, str]:
    """The environment for child processes, able to import this very idemstore."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def mock_server_argv(counter: Path) -> list[str]:
    """The command that runs the mock MCP server, counting executions in ``counter``."""
    return [sys.executable, "-m", "idemstore.bench.mock_server", "--counter", str(counter)]


def relay_argv(server: Sequence[str]) -> list[str]:
    """The command that runs ``server`` behind a bare stdio relay (``stdio_relay``)."""
    return [sys.executable, "-m", "idemstore.bench.stdio_relay", "--", *server]


def proxy_argv(server: Sequence[str]) -> list[str]:
    """The command that runs ``server`` behind ``idemstore proxy`` on a memory store."""
    return [sys.executable, "-m", "idemstore", "proxy", "--store", PROXY_STORE, "--", *server]


class StdioClient:
    """A bare JSON-RPC client over a child's stdio: one request at a time, answers by id."""

    __slots__ = ("_next_id", "_process")

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._next_id = 0

    async def start(self, argv: Sequence[str]) -> None:
        self._process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=checkout_env(),
        )
        await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "idemstore-bench", "version": "1"},
            },
        )
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        await self._process.stdin.drain()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its ``result``; raise on an error answer or a timeout."""
        assert self._process is not None and self._process.stdout is not None
        self._next_id += 1
        request_id = self._next_id
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            line = await asyncio.wait_for(self._process.stdout.readline(), RPC_TIMEOUT)
            if not line:
                raise ConnectionError(f"the server closed stdout before answering {method}")
            message = json.loads(line)
            if message.get("id") != request_id:
                continue  # a notification or a server-to-client request: not ours
            if "error" in message:
                raise RuntimeError(f"{method} failed: {message['error']}")
            result: dict[str, Any] = message.get("result") or {}
            return result

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            process.kill()
            await process.wait()


async def measure_stdio(argv_for: Callable[[Path], list[str]], load: Load) -> Timing:
    """Time ``tools/call`` on fresh arguments, then count executions of identical calls.

    ``argv_for(counter)`` is the command to run. The timing's ``executions`` are those of the
    ``IDENTICAL_CALLS`` identical calls alone; ``unique_keys`` is 1 (they are one call).
    """
    with tempfile.TemporaryDirectory(prefix="idemstore-bench-proxy-") as tmp:
        counter = Path(tmp) / "executions"
        counter.touch()
        client = StdioClient()
        pad = "x" * load.payload_bytes
        try:
            await client.start(argv_for(counter))
            timing = Timing()
            clock = time.perf_counter_ns
            deadline = None if load.duration is None else time.monotonic() + load.duration
            j = 0
            started = time.perf_counter()
            while keep_going(j, load.ops, deadline):
                begun = clock()
                try:
                    await client.request(
                        "tools/call", {"name": "record", "arguments": {"n": j, "pad": pad}}
                    )
                except (RuntimeError, ValueError, TimeoutError) as exc:
                    timing.record_error(exc)
                else:
                    timing.latencies_ns.append(clock() - begun)
                j += 1
            timing.seconds = time.perf_counter() - started
            before = len(counter.read_text().split())
            for _ in range(IDENTICAL_CALLS):
                await client.request(
                    "tools/call", {"name": "record", "arguments": {"n": "identical"}}
                )
            timing.executions = len(counter.read_text().split()) - before
            timing.unique_keys = 1
        finally:
            await client.close()
    return timing


async def run_proxy(load: Load) -> Measurement | Unavailable:
    """``tools/call`` through ``idemstore proxy`` (memory store) against calling directly."""
    try:
        importlib.import_module(PROXY_MODULE)
    except ImportError as exc:
        return Unavailable(
            "mcp proxy", f"{PROXY_MODULE} cannot be imported ({exc})", scenario="proxy"
        )
    directs: list[Timing] = []
    relayed: list[Timing] = []
    proxieds: list[Timing] = []
    try:
        # Alternating rounds, as store and floor do: drift on the machine hits all sides.
        for part in rounds_of(load):
            directs.append(await measure_stdio(mock_server_argv, part))
            relayed.append(await measure_stdio(lambda c: relay_argv(mock_server_argv(c)), part))
            proxieds.append(await measure_stdio(lambda c: proxy_argv(mock_server_argv(c)), part))
    except (OSError, ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
        return Unavailable("mcp proxy", f"{type(exc).__name__}: {exc}", scenario="proxy")
    direct, proxied, relay = merge(directs), merge(proxieds), merge(relayed)
    # Executions of the identical calls are counted per round; any round shows the rule,
    # and the worst one is reported.
    direct.executions = min(t.executions for t in directs)
    proxied.executions = max(t.executions for t in proxieds)
    proxied.unique_keys = direct.unique_keys = 1
    notes: dict[str, Any] = {
        "identical_calls": IDENTICAL_CALLS,
        "direct_executions": direct.executions,
        **added_latency(relay, direct, "relay_"),
    }
    return through_layer(
        "proxy",
        proxied,
        direct,
        direct_name="the mock server called directly",
        store=PROXY_STORE,
        notes=notes,
    )
