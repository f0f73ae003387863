"""The Redis store: connections, URL options, and the contract on top of the Lua scripts.

Every operation is one Lua script run with EVALSHA (EVAL when the node answers NOSCRIPT) on
exactly one key, so it is one round trip, atomic, and works unchanged on Redis Cluster. Lease
and retention deadlines are hash fields compared with the server's ``TIME``; the key's own
expiry removes a record by itself shortly after its retention ends (``expiry_grace``).
``wait`` is woken by a PUBLISH that ``complete``, ``release`` and ``delete`` send from inside
their script, on one pub/sub connection per store (on a Redis 7 cluster SPUBLISH, received per
node: see ``notifier.ShardNotifiers``), and falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from typing import TYPE_CHECKING, Any, Self

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from idemstore.backends.arguments import retention_while_held
from idemstore.backends.backoff import REDIS_TIMEOUTS, Backoff, retrying
from idemstore.backends.envelope import StoreEnvelope
from idemstore.backends.redis.client_errors import redis_errors
from idemstore.backends.redis.clients import (
    data_options,
    driver_options,
    new_client,
    retry_policy,
)
from idemstore.backends.redis.clocks import RedisClocks
from idemstore.backends.redis.cluster_wait import TOPOLOGY_ERRORS
from idemstore.backends.redis.codec import (
    MAX_DURATION,
    decode_record,
    integer,
    key_ttl_ms,
    micros,
    record_key,
    seconds,
)
from idemstore.backends.redis.deadlines import Deadlines
from idemstore.backends.redis.keyspace import listed, prefix_keys
from idemstore.backends.redis.notifier import (
    Notifier,
    ShardNotifiers,
    Subscription,
    shard_pubsub_everywhere,
)
from idemstore.backends.redis.options import DEFAULT_PREFIX, OPTIONS, check_together
from idemstore.backends.redis.persistence import PrimaryPersistence
from idemstore.backends.redis.script_calls import ScriptCalls, routed_call
from idemstore.backends.redis.scripts import SCRIPTS, SHARDED_SCRIPTS, Script
from idemstore.backends.redis.slots import ConnectionSlots
from idemstore.backends.redis.stats import BATCH, FIELDS, count_records
from idemstore.backends.redis.sweeping import SWEEP_BATCH, sweep_expired
from idemstore.backends.redis.urls import parse_redis_url
from idemstore.backends.urls import redact_url
from idemstore.backends.waiting import Sighting, wait_for_holder
from idemstore.checkpoints import decode_checkpoints, encode_checkpoint
from idemstore.errors import StoreUnavailableError
from idemstore.protocol import Lease, Outcome, Record, Reservation
from idemstore.records import MAX_KEY_LENGTH, RecordQuery, new_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

    from idemstore.backends.stats import StoreStats

__all__ = ["RedisStore"]

# What a reserve script answers, as Outcome members bound once (on Python 3.11 naming a
# member, Outcome.ACQUIRED, is a descriptor call on every reserve).
_ACQUIRED = Outcome.ACQUIRED
_FOUND = {b"m": Outcome.MISMATCH, b"c": Outcome.COMPLETED, b"p": Outcome.IN_PROGRESS}
# REDIS_TIMEOUTS from its second pause on: what follows a first attempt that stalled.
AFTER_FIRST_RETRY = Backoff(min(REDIS_TIMEOUTS.first * 2, REDIS_TIMEOUTS.cap), REDIS_TIMEOUTS.cap)


class RedisStore(StoreEnvelope[Any]):
    """A store in Redis or Redis Cluster. Build it with ``open_store(url)`` or ``from_url``.

    Its options (URL query parameters or keyword arguments) are ``options.OPTIONS``; see
    docs/backends/redis.md. ``redis+sentinel://`` follows the primary the Sentinels name;
    ``wait_replicas`` makes every write wait for that many replicas (see ``replication``, and
    ``cluster_wait`` for Redis Cluster).
    """

    __slots__ = (
        "_answered",
        "_attempt_timeout",
        "_calls",
        "_client_options",
        "_cluster",
        "_deadlines",
        "_errors",
        "_grace_ms",
        "_max_connections",
        "_nodes",
        "_notifier",
        "_operation_timeout",
        "_prefix",
        "_queue_timeout",
        "_retries",
        "_scripts",
        "_sentinel",
        "_sentinel_service",
        "_shards",
        "_slots",
        "_wait_replicas",
        "_wait_replicas_ms",
        "_where",
        "clocks",
    )

    def __init__(
        self,
        nodes: list[tuple[str, int]],
        *,
        cluster: bool = False,
        sentinel_service: str | None = None,
        username: str | None = None,
        password: str | None = None,
        url: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        db: int = 0,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 5.0,
        retries: int = 2,
        operation_timeout: float | None = None,
        max_connections: int = 100,
        expiry_grace: float = 60.0,
        max_key_length: int = MAX_KEY_LENGTH,
        wait_replicas: int = 0,
        wait_replicas_timeout: float = 1.0,
        volatile_primary: str = "refuse",
        ssl: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_cert_reqs: str = "required",
        ssl_check_hostname: bool = True,
        max_clock_skew: float = 1.0,
        clock_skew_policy: str = "warn",
        clock_check_interval: float = 60.0,
    ) -> None:
        """``nodes``, ``cluster``, ``sentinel_service``, ``username`` and ``password`` are what
        a URL's scheme, hosts, path and user part say; ``url``, when given, is shown (password
        hidden) in errors. The other arguments are the options of ``options.OPTIONS``."""
        given = OPTIONS.check(locals())
        check_together(nodes, cluster, given)
        super().__init__(max_key_length=max_key_length)
        self._nodes = list(nodes)
        self._cluster = cluster
        self._prefix = prefix
        self._operation_timeout: float | None = given["operation_timeout"]
        self._queue_timeout: float = self._operation_timeout or given["socket_timeout"]
        self._grace_ms = math.ceil(min(given["expiry_grace"], MAX_DURATION) * 1000)
        self._where = redact_url(url) if url else ",".join(f"{h}:{p}" for h, p in nodes)
        # Each attempt of a command is bounded here (see _call), not by redis-py's
        # socket_timeout: with one set, redis-py runs every send under asyncio.wait_for (a task
        # of its own per command on Python 3.11) and every read under a timer of its own, which
        # cost the hot path more than the script's whole server time.
        self._attempt_timeout: float = given["socket_timeout"]
        self._deadlines = Deadlines(self._attempt_timeout)
        self._retries = retries
        self._answered = False
        options = driver_options(username, password, given)
        # A cluster's shard pub/sub connections keep redis-py's socket timeout (off the hot
        # path); a single server's come from the data pool, and the notifier bounds its own
        # waits there (subscribing within the wait's timeout, reads of at most 1 s).
        self._shards = ShardNotifiers(
            {**options, "retry": retry_policy(retries, RedisConnectionError, RedisTimeoutError)}
        )
        if wait_replicas:
            # Each new primary's persistence is checked on its first connection (see
            # persistence): off the hot path, and again after a failover.
            options["redis_connect_func"] = PrimaryPersistence(
                given["volatile_primary"], self._where
            ).connect
        self._client_options = data_options(options, cluster=cluster, db=db)
        # The driver's pools fail (rather than wait) when exhausted, so limit in-flight
        # operations here; the pool gets one more connection for the pub/sub reader.
        self._max_connections = max_connections
        self._slots = ConnectionSlots(max_connections)
        self._sentinel_service = sentinel_service
        self._sentinel: Any = None
        self._wait_replicas = wait_replicas
        self._wait_replicas_ms = math.ceil(given["wait_replicas_timeout"] * 1000)
        self._notifier = Notifier(self._open_pubsub)
        self._scripts: dict[str, Script] = SCRIPTS
        self._calls: ScriptCalls | None = None
        self._errors = redis_errors(self._where)
        self.clocks = RedisClocks(self._where, given, sentinel_service)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        found = parse_redis_url(url, options)
        settings = {"db": found.db, "ssl": found.ssl, **OPTIONS.from_url(found.parsed)}
        return cls(
            found.nodes,
            cluster=found.cluster,
            sentinel_service=found.sentinel_service,
            username=found.username,
            password=found.password,
            url=url,
            **settings,
        )

    # -- connections ----------------------------------------------------------------------

    def _new_client(self) -> Any:
        self._sentinel, client = new_client(
            self._nodes,
            cluster=self._cluster,
            sentinel_service=self._sentinel_service,
            options=self._client_options,
            max_connections=self._max_connections + 1,
            ask_timeout=self._attempt_timeout,
        )
        if not (self._cluster or self._sentinel_service or self._wait_replicas):
            self._calls = ScriptCalls(client.connection_pool, self._slots)
        return client

    async def _open(self) -> Any:
        client = self._new_client()
        try:
            if self._cluster:
                # The nodes' data connections have no socket timeout (_call bounds each
                # command): bound the discovery of the slots here.
                async with asyncio.timeout(
                    self._attempt_timeout + self._client_options["socket_connect_timeout"]
                ):
                    await client.initialize()
                    if await shard_pubsub_everywhere(client):
                        self._scripts = SHARDED_SCRIPTS
            await self.clocks.opened(client, self._sentinel, self._calls)
        except BaseException:
            await client.aclose()
            raise
        return client

    async def _discard(self, connection: Any) -> None:
        await connection.aclose()

    async def _notifier_for(self, name: bytes) -> Notifier:
        """Where messages about ``name`` arrive: the store's notifier, or its node's."""
        client = await self._connect()
        if self._scripts is SHARDED_SCRIPTS:
            return self._shards.for_node(client.get_node_from_key(name))
        return self._notifier

    async def _open_pubsub(self) -> tuple[Any, Any]:
        """A pub/sub connection: on a cluster, to any node (PUBLISH reaches every node)."""
        client = await self._connect()
        if not self._cluster:
            return None, client.pubsub()
        return await self._shards.connect(random.choice(client.get_nodes()))

    def _run(self, name: str, key: bytes, *args: str | bytes) -> Awaitable[Any]:
        """Run one script on ``key``; with ``operation_timeout``, within that time."""
        if self._operation_timeout is None:
            # The hot path: no timer of our own (the socket timeouts bound every wait), and
            # no coroutine of its own either: the caller awaits _call's.
            return self._call(name, key, args)
        return self._call_within(self._operation_timeout, name, key, args)

    async def _call_within(
        self, timeout: float, name: str, key: bytes, args: tuple[str | bytes, ...]
    ) -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await self._call(name, key, args)
        except TimeoutError as exc:
            raise self._errors.translate(exc) from exc

    async def _call(self, name: str, key: bytes, args: tuple[str | bytes, ...]) -> Any:
        """EVALSHA, or EVAL when the node does not know the script (yet, or any more).

        Each attempt has ``socket_timeout`` for its reply (connecting included); one that
        runs out on a server that answered before is retried, ``retries`` times, with
        redis-py's backoff. A retry is safe: every script answers a repeat of its own call
        as it answered the first (reserve by its token, complete and release by their nonce)."""
        try:
            client = self._connection
            if client is None:
                client = await self._connect()
            self.clocks.check_calls()
            script = self._scripts[name]
            if not self._slots.take_now():
                await self._acquire_slot()
            try:
                # The first attempt outside ``retrying`` (two coroutine frames fewer per call);
                # after it, the pauses and attempts ``retrying`` would have taken.
                reply = await self._attempt(client, script, key, args)
            except Exception as exc:
                if not self._retries or not self._stalled(exc):
                    raise
                await asyncio.sleep(REDIS_TIMEOUTS.first)
                reply = await retrying(
                    lambda: self._attempt(client, script, key, args),
                    retry_on=self._stalled,
                    backoff=AFTER_FIRST_RETRY,
                    attempts=self._retries,
                )
            finally:
                self._slots.give()
            self._answered = True
            return reply
        except self._errors.catches as exc:
            raise self._errors.translate(exc) from exc

    def _stalled(self, exc: Exception) -> bool:
        """Whether an attempt that failed is worth another: one that ran out of time on a
        server that answered this store before. One that never did is down or hung, and more
        attempts would only hold the caller ``retries`` times longer. On a cluster with
        ``wait_replicas`` the store routes the write itself, so it also retries what redis-py
        retries there: a lost node or a cluster electing a primary (the slot map refreshed)."""
        if self._wait_replicas and self._cluster and isinstance(exc, TOPOLOGY_ERRORS):
            return True
        return isinstance(exc, TimeoutError) and self._answered

    async def _attempt(
        self, client: Any, script: Script, key: bytes, args: tuple[str | bytes, ...]
    ) -> Any:
        """One try of ``_call`` within ``socket_timeout`` (``deadlines``): on a single server
        through the store's own connections (``script_calls``), else redis-py's routing."""
        bound = self._deadlines.start()
        try:
            if self._calls is not None:
                return await self._calls.call(script, key, args)
            return await routed_call(
                client,
                script,
                key,
                args,
                replicas=self._wait_replicas,
                timeout_ms=self._wait_replicas_ms,
                cluster=self._cluster,
                where=self._where,
            )
        except asyncio.CancelledError as exc:
            if bound.timed_out():
                raise TimeoutError from exc
            raise
        finally:
            bound.end()

    async def _acquire_slot(self) -> None:
        try:
            await self._slots.take(self._queue_timeout)
        except TimeoutError:
            raise StoreUnavailableError(
                f"redis store {self._where}: all {self._max_connections} connections stayed "
                f"busy for {self._queue_timeout}s (raise max_connections?)"
            ) from None

    def storage_key(self, scope: str, key: str) -> bytes:
        """The Redis key that holds ``(scope, key)``'s record (for an operator or a meter)."""
        return record_key(self._prefix, scope, key)

    _key = storage_key  # the short name the scripts' calls below use

    # -- the contract ---------------------------------------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        token = new_token()
        lease_us = micros(lease_ttl)
        held = retention_while_held(lease_ttl, retention)
        reply = await self._run(
            "reserve",
            self._key(scope, key),
            fingerprint,
            token,
            lease_us,
            micros(held),
            key_ttl_ms(held, self._grace_ms),
        )
        if type(reply) is int:
            # The server's clock: a first acquisition (fence 1, nothing taken over), whose
            # lease deadline is computed here exactly as the script stored it.
            lease = Lease(scope, key, token, 1, seconds(reply + int(lease_us)), retention)
            return Reservation(_ACQUIRED, lease, None, False)
        outcome = reply[0]
        if outcome == b"a":
            _, _, fence, takeover, deadline, kept = reply
            lease = Lease(scope, key, token, integer(fence), seconds(deadline), retention)
            return Reservation(_ACQUIRED, lease, None, bool(takeover), decode_checkpoints(kept))
        return Reservation(_FOUND[outcome], None, decode_record(scope, key, reply[2:]))

    async def _complete(self, lease: Lease, response: bytes, retention: float) -> bool:
        reply = await self._run(
            "complete",
            self._key(lease.scope, lease.key),
            lease.token,
            str(lease.fence),
            new_token(),
            response,
            micros(retention),
            key_ttl_ms(retention, self._grace_ms),
        )
        return reply is not None

    async def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        reply = await self._run(
            "checkpoint",
            self._key(lease.scope, lease.key),
            lease.token,
            str(lease.fence),
            new_token(),
            encode_checkpoint(name, data),
        )
        return reply is not None

    async def _release(self, lease: Lease) -> bool:
        reply = await self._run(
            "release", self._key(lease.scope, lease.key), lease.token, str(lease.fence), new_token()
        )
        return reply is not None

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        reply = await self._run(
            "extend",
            self._key(lease.scope, lease.key),
            lease.token,
            str(lease.fence),
            micros(lease_ttl),
            micros(retention_while_held(lease_ttl, lease.retention)),
            key_ttl_ms(retention_while_held(lease_ttl, lease.retention), self._grace_ms),
        )
        if reply is None:
            return None
        return Lease(
            lease.scope, lease.key, lease.token, lease.fence, seconds(reply), lease.retention
        )

    async def _read(self, scope: str, key: str, name: bytes) -> Sighting:
        reply = await self._run("get", name)
        if reply is None:
            return Sighting(None, 0.0)
        return Sighting(decode_record(scope, key, reply[1:]), seconds(reply[0]))

    async def _get(self, key: str, scope: str) -> Record | None:
        return (await self._read(scope, key, self._key(scope, key))).record

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        """Woken by the PUBLISH of complete/release/delete; every read is bounded by the time
        left (the socket timeouts and redis-py's retries could otherwise hold one far past
        ``timeout``)."""
        name = self._key(scope, key)

        async def subscribe() -> Subscription:
            notifier = await self._notifier_for(name)
            event, confirmed = await notifier.subscribe(name, self._queue_timeout)
            return Subscription(notifier, name, event, confirmed)

        return await wait_for_holder(
            lambda: self._read(scope, key, name),
            timeout=timeout,
            unavailable=self._errors.translate,
            subscribe=subscribe,
        )

    async def _delete(self, key: str, scope: str) -> bool:
        return bool(await self._run("delete", self._key(scope, key)))

    async def _sweep(self, limit: int) -> int:
        """Remove up to ``limit`` records past retention that Redis has not expired yet.

        Redis deletes every record by itself ``expiry_grace`` after its retention ends, so a
        sweeper is optional; this is a pass over the keyspace (SCAN, every primary).
        """
        try:
            client = await self._connect()
            return await sweep_expired(
                self._prefix_keys(client, SWEEP_BATCH),
                lambda names: self._pipelined(client, "pttl", names),
                lambda name: self._run("sweep", name),
                grace_ms=self._grace_ms,
                limit=limit,
            )
        except self._errors.catches as exc:
            raise self._errors.translate(exc) from exc

    async def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        names = self._prefix_keys(await self._connect(), BATCH)
        async for record in listed(names, self._prefix, self._read, self._errors, query):
            yield record

    def _prefix_keys(self, client: Any, count: int) -> AsyncIterator[bytes]:
        return prefix_keys(client, self._prefix, count, self._attempt_timeout)

    async def _stats(self, limit: int) -> StoreStats:
        """Read at most ``limit`` records: SCAN of the prefix (every primary on a cluster)
        and one HMGET of four fields per record, pipelined by ``stats.BATCH``. Redis keeps
        no count by state, so this is a pass over the keyspace, bounded by ``limit``."""
        try:
            client = await self._connect()
            async with asyncio.timeout(self._attempt_timeout):
                seconds, micros = await client.time()
            return await count_records(
                self._prefix_keys(client, BATCH),
                lambda names: self._pipelined(client, "hmget", names, *FIELDS),
                seconds + micros / 1e6,
                limit,
            )
        except self._errors.catches as exc:
            raise self._errors.translate(exc) from exc

    async def _pipelined(self, client: Any, command: str, names: list[bytes], *args: str) -> Any:
        """``command`` on each of ``names``, pipelined, within ``socket_timeout``, holding
        one connection slot."""
        await self._acquire_slot()
        try:
            pipe = client.pipeline(transaction=False) if not self._cluster else client.pipeline()
            for name in names:
                getattr(pipe, command)(name, *args)
            async with asyncio.timeout(self._attempt_timeout):
                return await pipe.execute()
        finally:
            self._slots.give()

    async def _ping(self) -> None:
        try:
            async with asyncio.timeout(self._operation_timeout or self._queue_timeout * 2):
                client = await self._connect()
                await (client.ping() if self._calls is None else self._calls.ping())
            self._answered = True
        except self._errors.catches as exc:
            raise self._errors.translate(exc) from exc

    async def _disconnect(self, connection: Any) -> None:
        await self.clocks.stop()
        await self._notifier.close()
        if self._calls is not None:
            await self._calls.close()
        await self._shards.close()
        if connection is not None:
            with contextlib.suppress(*self._errors.catches):
                await connection.aclose()
        for asked in self._sentinel.sentinels if self._sentinel is not None else ():
            with contextlib.suppress(*self._errors.catches):
                await asked.aclose()

    async def _enter(self) -> None:
        await self._ping()
