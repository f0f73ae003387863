"""The ``peers`` bench scenario: idemstore beside what users would pick instead, same run.

The peers are idemkit (async; Redis, PostgreSQL, DynamoDB through aioboto3) and AWS Lambda
Powertools' idempotency utility (synchronous; Redis and DynamoDB, no PostgreSQL). On every
target whose engine a peer supports, the same decorated function runs through idemstore's
matching door (``idemstore.Idempotency`` for an async peer, ``idemstore.sync.Idempotency``
from a plain thread for a sync one) and through the peer, on the same server: a first call
(the key absent), then a replay of that key (completed). Each library keys the call by
``order["order_id"]``, in its documented default configuration otherwise (no in-process
cache on any side). Sides take turns in rounds, as store and floor do elsewhere, so drift on
a shared machine lands on all of them.

A ``Measurement`` has idemstore as its subject and the peer as its floor ("the same work
without idemstore"): ``x floor p50`` under 1.00 means idemstore answered faster.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from idemstore.backends.registry import engine_for_url
from idemstore.backends.urls import redact_url
from idemstore.bench.results import Measurement, Timing, Unavailable
from idemstore.bench.scenarios import ON_REQUEST, keep_going, merge, rounds_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from idemstore.bench.runner import Target
    from idemstore.bench.scenarios import Load

__all__ = [
    "FIRST",
    "PEERS",
    "REPLAY",
    "SCENARIO",
    "Peer",
    "default_scenarios",
    "installed_peers",
    "peer_note",
    "run_peers",
    "timed_sides",
]

SCENARIO = "peers"
FIRST = "peers-first"
REPLAY = "peers-replay"
SCOPE = "idemstore-bench"
RETENTION = 3600
LEASE_TTL = 30.0
# What the peers store their records in, beside idemstore's (created when absent).
PEER_TABLE = "idemstore_bench_peer_records"
# The work every side runs: a small JSON argument in, a small JSON result out.
ORDER: dict[str, Any] = {
    "amount": 1250,
    "currency": "EUR",
    "items": [{"sku": "A-100", "qty": 2}, {"sku": "B-7", "qty": 1}],
    "note": "leave at the door",
}
RECEIPT: dict[str, Any] = {"status": "charged", "receipt": "r-1", "amount": 1250}

Door = Literal["async", "sync"]


@dataclass(frozen=True, slots=True)
class Peer:
    """A package users pick instead: its distribution, its import name and its door."""

    name: str
    distribution: str
    module: str
    door: Door
    engines: tuple[str, ...]


PEERS: tuple[Peer, ...] = (
    Peer("idemkit", "idemkit", "idemkit", "async", ("redis", "postgres", "dynamodb")),
    Peer(
        "powertools",
        "aws-lambda-powertools",
        "aws_lambda_powertools",
        "sync",
        ("redis", "dynamodb"),
    ),
)
# Why a peer lacks an engine, said in its cell.
NO_ENGINE = {
    ("powertools", "postgres"): "aws-lambda-powertools has no PostgreSQL persistence layer",
}


def installed_peers() -> list[Peer]:
    """The peers whose package can be imported here."""
    return [peer for peer in PEERS if importlib.util.find_spec(peer.module) is not None]


def default_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a run that names none runs them: without ``peers`` when no peer package
    is installed (it then says nothing about packages its user never asked to compare with),
    and without the scenarios that run only when named (``ON_REQUEST``: they start brokers)."""
    skipped = set(ON_REQUEST) if installed_peers() else {SCENARIO, *ON_REQUEST}
    return tuple(name for name in names if name not in skipped)


@dataclass(slots=True)
class _Side:
    """One library on one engine through one door: ``call(order_id)`` runs the decorated
    function (awaited for the async door, in a worker thread for the sync one)."""

    label: str
    door: Door
    call: Callable[[str], Any]
    close: Callable[[], Awaitable[None]]
    executions: list[int] = field(default_factory=lambda: [0])


def _peer_module(name: str) -> Any:
    """A peer's module, imported when its side opens. Untyped on purpose: the peers are
    optional, and the bench type-checks the same with or without them."""
    return importlib.import_module(name)


def _counting(executions: list[int]) -> Callable[..., dict[str, Any]]:
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        executions[0] += 1
        return dict(RECEIPT)

    return charge


# -- where each library finds the target's server ---------------------------------------------


def _plain_redis_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"the peers take a plain redis:// URL, not {parts.scheme}://")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _asyncpg_dsn(url: str) -> str:
    """The server and database of a store URL, its ``schema`` as the search path (asyncpg
    passes unknown DSN parameters to the server as settings)."""
    parts = urlsplit(url)
    schema = parse_qs(parts.query).get("schema")
    query = urlencode({"search_path": schema[0]}) if schema else ""
    return urlunsplit(("postgresql", parts.netloc, parts.path, query, ""))


def _dynamodb_place(url: str) -> tuple[str | None, str]:
    """The endpoint (``None``: AWS's) and region of a ``dynamodb://`` store URL."""
    query = parse_qs(urlsplit(url).query)
    return query.get("endpoint_url", [None])[0], query.get("region", ["us-east-1"])[0]


# -- idemstore ------------------------------------------------------------------------------


def _order_id(order: dict[str, Any]) -> str:
    return str(order["order_id"])


async def _idemstore_async(url: str) -> _Side:
    from idemstore.backends.urls import open_store
    from idemstore.runner import Idempotency

    store = open_store(url)
    await store.__aenter__()
    side = _Side("idemstore", "async", lambda _: None, store.close)
    charge = _counting(side.executions)

    async def work(order: dict[str, Any]) -> dict[str, Any]:
        return charge(order)

    work.__qualname__ = "charge"
    runner = Idempotency(store, lease_ttl=LEASE_TTL, retention=RETENTION)
    decorated = runner.idempotent(_order_id, scope=SCOPE)(work)
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


async def _idemstore_sync(url: str) -> _Side:
    from idemstore.sync import Idempotency

    runner = await asyncio.to_thread(Idempotency, url, lease_ttl=LEASE_TTL, retention=RETENTION)

    async def close() -> None:
        await asyncio.to_thread(runner.close)

    side = _Side("idemstore", "sync", lambda _: None, close)
    decorated = runner.idempotent(_order_id, scope=SCOPE)(_counting(side.executions))
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


# -- idemkit (async) ------------------------------------------------------------------------


async def _idemkit_backend(engine: str, url: str) -> Any:
    if engine == "redis":
        redis = _peer_module("idemkit.backends.redis")
        return redis.RedisBackend.from_url(_plain_redis_url(url), namespace=f"{SCOPE}:")
    if engine == "postgres":
        postgres = _peer_module("idemkit.backends.postgres")
        dsn = _asyncpg_dsn(url)
        await postgres.init_pg(dsn, table=PEER_TABLE)
        return postgres.PostgresBackend.from_url(dsn, table=PEER_TABLE)
    dynamodb = _peer_module("idemkit.backends.dynamodb")
    endpoint, region = _dynamodb_place(url)
    return dynamodb.DynamoBackend(table=PEER_TABLE, endpoint_url=endpoint, region_name=region)


async def _idemkit(engine: str, url: str) -> _Side:
    idemkit = _peer_module("idemkit")
    backend = await _idemkit_backend(engine, url)
    side = _Side("idemkit", "async", lambda _: None, backend.aclose)
    charge = _counting(side.executions)
    config = idemkit.MethodConfig(
        key_fields=["order.order_id"],
        scope=lambda: SCOPE,
        lease_ttl_seconds=LEASE_TTL,
        expires_after_seconds=RETENTION,
    )

    async def work(order: dict[str, Any]) -> dict[str, Any]:
        return charge(order)

    work.__name__ = work.__qualname__ = "charge"
    decorated = idemkit.idempotent(backend=backend, config=config)(work)
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


# -- Powertools (sync) ----------------------------------------------------------------------


def _powertools_dynamodb_table(client: Any) -> None:
    """Powertools' table (partition key ``id``), created when absent, as its docs describe."""
    try:
        client.describe_table(TableName=PEER_TABLE)
    except client.exceptions.ResourceNotFoundException:
        client.create_table(
            TableName=PEER_TABLE,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        client.get_waiter("table_exists").wait(TableName=PEER_TABLE)


def _powertools_layer(engine: str, url: str) -> tuple[Any, Callable[[], None]]:
    """Powertools' persistence layer on the target, and how to close its client."""
    persistence = "aws_lambda_powertools.utilities.idempotency.persistence"
    if engine == "redis":
        client = _peer_module("redis").Redis.from_url(_plain_redis_url(url))
        module = _peer_module(f"{persistence}.redis")
        # The documented name; in 3.x an alias of the class that warns it is deprecated.
        layer_class = getattr(module, "CachePersistenceLayer", None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            layer = (layer_class or module.RedisCachePersistenceLayer)(client=client)
        return layer, client.close
    endpoint, region = _dynamodb_place(url)
    dynamodb = _peer_module("boto3").client("dynamodb", endpoint_url=endpoint, region_name=region)
    _powertools_dynamodb_table(dynamodb)
    layer = _peer_module(f"{persistence}.dynamodb").DynamoDBPersistenceLayer(
        PEER_TABLE, boto3_client=dynamodb
    )
    return layer, dynamodb.close


async def _powertools(engine: str, url: str) -> _Side:
    powertools = _peer_module("aws_lambda_powertools.utilities.idempotency")
    # Outside Lambda there is no remaining time to read, and Powertools warns so on every
    # first call: once is in docs/benchmarks.md, a thousand times is noise.
    warnings.filterwarnings("ignore", "Couldn't determine the remaining time", UserWarning)
    layer, close_client = await asyncio.to_thread(_powertools_layer, engine, url)

    async def close() -> None:
        await asyncio.to_thread(close_client)

    side = _Side("powertools", "sync", lambda _: None, close)
    config = powertools.IdempotencyConfig(
        event_key_jmespath="order_id", expires_after_seconds=RETENTION
    )
    charge = _counting(side.executions)
    decorated = powertools.idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config
    )(charge)
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


async def _open_peer(peer: Peer, engine: str, url: str) -> _Side:
    if peer.name == "idemkit":
        return await _idemkit(engine, url)
    return await _powertools(engine, url)


def _engine_missing(peer: Peer, engine: str) -> str | None:
    """Why ``peer`` cannot run on ``engine`` here, or ``None`` when it can."""
    if engine not in peer.engines:
        return NO_ENGINE.get((peer.name, engine), f"{peer.distribution} has no {engine} layer")
    if (peer.name, engine) == ("idemkit", "dynamodb") and not importlib.util.find_spec("aioboto3"):
        return "idemkit's DynamoDB backend needs aioboto3, which is not installed"
    return None


def timed_sides(engine: str) -> int:
    """How many sides the scenario times on a target of ``engine`` with the peers installed
    here: per door that has a peer, idemstore's and each peer's."""
    peers = [peer for peer in installed_peers() if _engine_missing(peer, engine) is None]
    per_door = [sum(peer.door == door for peer in peers) for door in ("async", "sync")]
    return sum(1 + n for n in per_door if n)


# -- the timed loops --------------------------------------------------------------------------


def _sync_calls(call: Callable[[str], Any], keys: list[str], timing: Timing) -> None:
    clock = time.perf_counter_ns
    for key in keys:
        begun = clock()
        try:
            call(key)
        except Exception as exc:
            timing.record_error(exc)
        else:
            timing.latencies_ns.append(clock() - begun)


async def _calls(side: _Side, keys: list[str], timing: Timing) -> None:
    """``side.call`` on every key in turn, timed; the work's executions are added up."""
    before = side.executions[0]
    started = time.perf_counter()
    if side.door == "sync":
        # From a plain thread, as a WSGI worker or a Lambda handler calls it.
        await asyncio.to_thread(_sync_calls, side.call, keys, timing)
    else:
        clock = time.perf_counter_ns
        for key in keys:
            begun = clock()
            try:
                await side.call(key)
            except Exception as exc:
                timing.record_error(exc)
            else:
                timing.latencies_ns.append(clock() - begun)
    timing.seconds += time.perf_counter() - started
    timing.executions += side.executions[0] - before


async def _first(side: _Side, prefix: str, part: Load, timing: Timing) -> list[str]:
    """First calls on fresh keys (half of a round's operations, or of its seconds; the rest
    are their replays); returns the keys."""
    keys: list[str] = []
    if part.ops is not None:
        keys = [f"{prefix}{j}" for j in range(max(1, part.ops // 2))]
        await _calls(side, keys, timing)
    else:
        deadline = time.monotonic() + (part.duration or 0.0) / 2
        while not keys or keep_going(len(keys), None, deadline):
            keys.append(f"{prefix}{len(keys)}")
            await _calls(side, keys[-1:], timing)
    timing.unique_keys += len(keys)
    return keys


@dataclass(slots=True)
class _Timed:
    first: list[Timing] = field(default_factory=list)
    replay: list[Timing] = field(default_factory=list)


async def _rounds(sides: list[_Side], load: Load, prefix: str) -> list[_Timed]:
    timed = [_Timed() for _ in sides]
    # Untimed first calls: pools open their connections, scripts get loaded.
    for side in sides:
        await _calls(side, [f"{prefix}{side.label}-warm"], Timing())
    # Short rounds (at most ROUND_SECONDS per side in a timed run), as store and floor take:
    # the speed of a shared machine drifts within seconds.
    for r, part in enumerate(rounds_of(load)):
        # Who goes first rotates, so no side always runs on another's heels.
        order = [(r + i) % len(sides) for i in range(len(sides))]
        for i in order:
            first, replay = Timing(), Timing()
            keys = await _first(sides[i], f"{prefix}{sides[i].label}-{r}-", part, first)
            await _calls(sides[i], keys, replay)
            timed[i].first.append(first)
            timed[i].replay.append(replay)
    return timed


def peer_note(m: Measurement) -> str | None:
    """One line for the report on a ``peers`` measurement: both p50s, and any execution the
    peer ran that it should not have."""
    if m.scenario not in (FIRST, REPLAY) or m.floor is None:
        return None
    ours, theirs = m.subject.latency_ms()["p50"], m.floor.latency_ms()["p50"]
    if ours is None or theirs is None:
        return None
    call = "first call" if m.scenario == FIRST else "replay"
    peer = m.notes.get("peer", m.floor_name)
    text = (
        f"{m.backend} ({m.notes.get('door')}), {call} p50: idemstore {ours:.3f} ms,"
        f" {peer} {theirs:.3f} ms"
    )
    ran, expected = m.notes.get("peer_executions"), m.notes.get("peer_expected_executions")
    if ran != expected:
        text += f"; {peer} ran the work {ran} times for {expected} expected"
    return text


# -- measurements -----------------------------------------------------------------------------


def _measurement(
    target: Target, door: Door, peer: _Side, ours: Timing, theirs: Timing, scenario: str
) -> Measurement:
    expected = ours.unique_keys if scenario == FIRST else 0
    notes: dict[str, Any] = {
        "peer": peer.label,
        "door": door,
        "peer_executions": theirs.executions,
        "peer_expected_executions": theirs.unique_keys if scenario == FIRST else 0,
    }
    mine, their = ours.latency_ms()["p50"], theirs.latency_ms()["p50"]
    if mine and their:
        notes["peer_x_p50"] = their / mine
    return Measurement(
        # Each peer has one door (its floor_name says which): the name stays short.
        backend=f"{target.name} vs {peer.label}",
        scenario=scenario,
        concurrency=1,
        subject=ours,
        floor=theirs,
        floor_name=f"{peer.label} ({door})",
        url=redact_url(target.url),
        expected_executions=expected,
        notes=notes,
    )


async def _on_door(
    target: Target, engine: str, door: Door, peers: list[Peer], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """idemstore's ``door`` beside every peer of that door, on one target."""
    out: list[Measurement | Unavailable] = []
    sides: list[_Side] = []
    try:
        opener = _idemstore_async if door == "async" else _idemstore_sync
        sides.append(await opener(target.url))
        for peer in peers:
            try:
                sides.append(await _open_peer(peer, engine, target.url))
            except Exception as exc:
                why = f"{peer.name} could not open: {type(exc).__name__}: {exc}"
                out.append(Unavailable(f"{target.name} vs {peer.name}", why, SCENARIO))
        if len(sides) < 2:
            return out
        timed = await _rounds(sides, load, f"{prefix}{target.name}-{door}-")
    finally:
        for side in sides:
            with contextlib.suppress(Exception):
                await side.close()
    ours_first, ours_replay = merge(timed[0].first), merge(timed[0].replay)
    for side, times in zip(sides[1:], timed[1:], strict=True):
        for scenario, ours, theirs in (
            (FIRST, ours_first, merge(times.first)),
            (REPLAY, ours_replay, merge(times.replay)),
        ):
            out.append(_measurement(target, door, side, ours, theirs, scenario))
    return out


async def _on_target(
    target: Target, engine: str, peers: list[Peer], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    out: list[Measurement | Unavailable] = []
    runnable: list[Peer] = []
    for peer in peers:
        missing = _engine_missing(peer, engine)
        if missing is None:
            runnable.append(peer)
        else:
            out.append(
                Unavailable(f"{target.name} vs {peer.name}", missing, SCENARIO, skipped=True)
            )
    for door in ("async", "sync"):
        of_door = [peer for peer in runnable if peer.door == door]
        if not of_door:
            continue
        try:
            out += await _on_door(target, engine, door, of_door, load, prefix)
        except Exception as exc:
            why = f"{door} door failed: {type(exc).__name__}: {exc}"
            out.append(Unavailable(target.name, why, SCENARIO))
    return out


async def run_peers(
    targets: Sequence[Target], load: Load, prefix: str
) -> list[Measurement | Unavailable]:
    """The scenario on every target whose engine a peer supports; a peer package that is not
    installed, an engine a peer lacks, or a target without a peer engine is ``Unavailable``
    with its reason, and never stops the run."""
    out: list[Measurement | Unavailable] = []
    peers = installed_peers()
    for peer in PEERS:
        if peer not in peers:
            why = f"{peer.distribution} is not installed: pip install {peer.distribution}"
            out.append(Unavailable(peer.name, why, SCENARIO, skipped=True))
    engines = {peer_engine for peer in PEERS for peer_engine in peer.engines}
    chosen = [
        (target, found.name)
        for target in targets
        if (found := engine_for_url(target.url)) is not None and found.name in engines
    ]
    if not chosen:
        why = "no Redis, PostgreSQL or DynamoDB target: give their URLs, or use --local"
        out.append(Unavailable(SCENARIO, why, skipped=True))  # printed as "peers: skipped: ..."
    if not peers:
        return out
    for target, engine in chosen:
        out += await _on_target(target, engine, peers, load, prefix)
    return out
