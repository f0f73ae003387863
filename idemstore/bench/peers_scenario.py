"""The ``peers`` bench scenario: idemstore beside what users would pick instead, same run.

The peers are idemkit (async; Redis, PostgreSQL, DynamoDB through aioboto3) and AWS Lambda
Powertools' idempotency utility (synchronous; Redis and DynamoDB, no PostgreSQL). On every
target whose engine a peer supports, the same decorated function runs through idemstore's
matching door (``idemstore.Idempotency`` for an async peer, ``idemstore.sync.Idempotency``
from plain threads for a sync one) and through the peer, on the same server: first calls
(the key absent), then replays of those keys (completed), by as many concurrent callers per
side as the run's ``--concurrency`` says, each level in turn (``peers_timing``). Each library
keys the call by ``order["order_id"]``, in its documented default configuration otherwise
(no in-process cache on any side). Sides take turns in rounds, as store and floor do
elsewhere, so drift on a shared machine lands on all of them.

A ``Measurement`` has idemstore as its subject and the peer as its floor ("the same work
without idemstore"): ``x floor p50`` under 1.00 means idemstore answered faster.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from idemstore.backends.registry import engine_for_url
from idemstore.backends.urls import redact_url
from idemstore.bench.peers_timing import Door, Executions, Side, timed_rounds
from idemstore.bench.results import Measurement, Timing, Unavailable
from idemstore.bench.scenarios import ON_REQUEST, merge

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

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


def _peer_module(name: str) -> Any:
    """A peer's module, imported when its side opens. Untyped on purpose: the peers are
    optional, and the bench type-checks the same with or without them."""
    return importlib.import_module(name)


def _counting(executions: Executions) -> Callable[..., dict[str, Any]]:
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        executions.add()
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


async def _idemstore_async(url: str) -> Side:
    from idemstore.backends.urls import open_store
    from idemstore.runner import Idempotency

    store = open_store(url)
    await store.__aenter__()
    side = Side("idemstore", "async", lambda _: None, store.close)
    charge = _counting(side.executions)

    async def work(order: dict[str, Any]) -> dict[str, Any]:
        return charge(order)

    work.__qualname__ = "charge"
    runner = Idempotency(store, lease_ttl=LEASE_TTL, retention=RETENTION)
    decorated = runner.idempotent(_order_id, scope=SCOPE)(work)
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


async def _idemstore_sync(url: str) -> Side:
    from idemstore.sync import Idempotency

    runner = await asyncio.to_thread(Idempotency, url, lease_ttl=LEASE_TTL, retention=RETENTION)

    async def close() -> None:
        await asyncio.to_thread(runner.close)

    side = Side("idemstore", "sync", lambda _: None, close)
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


async def _idemkit(engine: str, url: str) -> Side:
    idemkit = _peer_module("idemkit")
    backend = await _idemkit_backend(engine, url)
    side = Side("idemkit", "async", lambda _: None, backend.aclose)
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


async def _powertools(engine: str, url: str) -> Side:
    powertools = _peer_module("aws_lambda_powertools.utilities.idempotency")
    # Outside Lambda there is no remaining time to read, and Powertools warns so on every
    # first call: once is in docs/benchmarks.md, a thousand times is noise.
    warnings.filterwarnings("ignore", "Couldn't determine the remaining time", UserWarning)
    layer, close_client = await asyncio.to_thread(_powertools_layer, engine, url)

    async def close() -> None:
        await asyncio.to_thread(close_client)

    side = Side("powertools", "sync", lambda _: None, close)
    config = powertools.IdempotencyConfig(
        event_key_jmespath="order_id", expires_after_seconds=RETENTION
    )
    charge = _counting(side.executions)
    decorated = powertools.idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config
    )(charge)
    side.call = lambda key: decorated(order={"order_id": key, **ORDER})
    return side


async def _open_peer(peer: Peer, engine: str, url: str) -> Side:
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
    callers = "1 caller" if m.concurrency == 1 else f"{m.concurrency} callers"
    text = (
        f"{m.backend} ({m.notes.get('door')}, {callers}), {call} p50: idemstore {ours:.3f} ms,"
        f" {peer} {theirs:.3f} ms"
    )
    ran, expected = m.notes.get("peer_executions"), m.notes.get("peer_expected_executions")
    if ran != expected:
        text += f"; {peer} ran the work {ran} times for {expected} expected"
    return text


# -- measurements -----------------------------------------------------------------------------


def _measurement(
    target: Target,
    door: Door,
    peer: Side,
    concurrency: int,
    measured: tuple[str, Timing, Timing],
) -> Measurement:
    scenario, ours, theirs = measured
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
        concurrency=concurrency,
        subject=ours,
        floor=theirs,
        floor_name=f"{peer.label} ({door})",
        url=redact_url(target.url),
        expected_executions=expected,
        notes=notes,
    )


async def _on_door(
    target: Target, engine: str, door: Door, peers: list[Peer], loads: list[Load], prefix: str
) -> list[Measurement | Unavailable]:
    """idemstore's ``door`` beside every peer of that door, on one target, at each load's
    concurrency (the sides opened once for all)."""
    out: list[Measurement | Unavailable] = []
    sides: list[Side] = []
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
        for load in loads:
            where = f"{prefix}{target.name}-{door}-c{load.concurrency}-"
            timed = await timed_rounds(sides, load, where)
            ours_first, ours_replay = merge(timed[0].first), merge(timed[0].replay)
            for side, times in zip(sides[1:], timed[1:], strict=True):
                for measured in (
                    (FIRST, ours_first, merge(times.first)),
                    (REPLAY, ours_replay, merge(times.replay)),
                ):
                    out.append(_measurement(target, door, side, load.concurrency, measured))
    finally:
        for side in sides:
            with contextlib.suppress(Exception):
                await side.close()
    return out


async def _on_target(
    target: Target, engine: str, peers: list[Peer], loads: list[Load], prefix: str
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
            out += await _on_door(target, engine, door, of_door, loads, prefix)
        except Exception as exc:
            why = f"{door} door failed: {type(exc).__name__}: {exc}"
            out.append(Unavailable(target.name, why, SCENARIO))
    return out


async def run_peers(
    targets: Sequence[Target], load: Load, prefix: str, *, levels: Sequence[int] = ()
) -> list[Measurement | Unavailable]:
    """The scenario on every target whose engine a peer supports, with ``load.concurrency``
    callers per side, or with each of ``levels`` in turn (the run's ``--concurrency``); a peer
    package that is not installed, an engine a peer lacks, or a target without a peer engine
    is ``Unavailable`` with its reason, and never stops the run."""
    loads = [replace(load, concurrency=n) for n in levels] or [load]
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
        out += await _on_target(target, engine, peers, loads, prefix)
    return out
