"""Script calls on a single server, on connections the store keeps: the hot path of every call.

redis-py's ``execute_command`` costs each call far more than the round trip needs: a pooled
connection taken and given back under an asyncio lock, observability events and metrics
around both, a retry wrapper, and the command packed argument by argument in Python. With a
single server (no cluster, Sentinel or ``wait_replicas``, which keep redis-py's routing) the
store makes its own connections from the pool's settings (the same handshake, retry policy
and timeouts), keeps the idle ones, and writes each call as one buffer, packed by hiredis
in C where it is installed, else with an ``EVALSHA sha 1`` head built once per script (the
fallback for ``EVAL``, too). ``ConnectionSlots`` already bounds the calls
in flight, so at most ``max_connections`` such connections ever exist (``ping`` and the
clock check's ``TIME`` use them too, the latter taking a slot of its own); the pool itself
then serves only pub/sub, ``sweep`` and ``stats``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from idemstore.backends.redis.cluster_wait import run_on_key_primary
from idemstore.backends.redis.replication import run_replicated

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.backends.redis.scripts import Script
    from idemstore.backends.redis.slots import ConnectionSlots

_pack: Callable[..., Any] | None
try:
    # hiredis packs a command in C, in about two thirds of packed_call's time.
    from hiredis import pack_command as _pack
except ImportError:  # the redis extra installs hiredis, but redis-py runs without it
    _pack = None

__all__ = ["ScriptCalls", "packed_call", "routed_call"]


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def packed_call(head: bytes, count: int, key: bytes, args: tuple[str | bytes, ...]) -> bytes:
    """A RESP array of ``count`` leading items (``head``, already packed), ``key`` and ``args``
    (a ``str`` as UTF-8, as redis-py's encoder sends it)."""
    parts = [b"*%d\r\n" % (count + 1 + len(args)), head, _bulk(key)]
    for arg in args:
        parts.append(_bulk(arg.encode() if isinstance(arg, str) else arg))
    return b"".join(parts)


def _heads(script: Script) -> tuple[bytes, bytes, bytes]:
    """The packed ``EVALSHA sha 1`` and ``EVAL source 1`` of ``script`` (3 items each, the
    array's length excluded), and its SHA as bytes (for hiredis)."""
    sha = script.sha.encode()
    return (
        b"$7\r\nEVALSHA\r\n" + _bulk(sha) + b"$1\r\n1\r\n",
        b"$4\r\nEVAL\r\n" + _bulk(script.source.encode()) + b"$1\r\n1\r\n",
        sha,
    )


class ScriptCalls:
    """EVALSHA (EVAL when the server lost the script) on connections made from ``pool``'s
    settings, each call on a connection nobody else uses meanwhile."""

    __slots__ = ("_free", "_heads", "_made", "_pool", "_slots")

    def __init__(self, pool: Any, slots: ConnectionSlots) -> None:
        self._pool = pool
        self._slots = slots  # the store's bound on calls in flight, for what runs beside them
        self._free: list[Any] = []
        self._made: list[Any] = []
        self._heads: dict[str, tuple[bytes, bytes, bytes]] = {}

    async def call(self, script: Script, key: bytes, args: tuple[str | bytes, ...]) -> Any:
        """The script's reply. A connection error is retried as redis-py retries it (the
        connection's ``retry`` policy, the connection closed before each new try); any other
        failure, a cancellation included, leaves the connection closed if its reply may still
        be on the wire (redis-py's connection does that itself)."""
        heads = self._heads.get(script.sha)
        if heads is None:
            heads = self._heads[script.sha] = _heads(script)
        if _pack is not None:
            first: bytes = _pack((b"EVALSHA", heads[2], b"1", key, *args))
        else:
            first = packed_call(heads[0], 3, key, args)
        connection = self._take()
        try:
            try:
                return await self._round_trip(connection, first)
            except NoScriptError:
                # The server restarted, was flushed or was promoted: EVAL caches it again.
                return await self._round_trip(connection, packed_call(heads[1], 3, key, args))
        finally:
            self._free.append(connection)

    async def ping(self) -> None:
        """PING on one of the same connections (the store's first use opens it, so a store
        that pinged, then ran calls one at a time, holds one connection)."""
        connection = self._take()
        try:
            await self._round_trip(connection, b"*1\r\n$4\r\nPING\r\n")
        finally:
            self._free.append(connection)

    async def time(self, timeout: float) -> Any:
        """``TIME`` (raw reply) on one of the same connections. It runs beside the calls (the
        clock check), so it waits up to ``timeout`` for a slot of its own: the store still
        never holds more than ``max_connections`` connections."""
        if not self._slots.take_now():
            await self._slots.take(timeout)
        connection = self._take()
        try:
            return await self._round_trip(connection, b"*1\r\n$4\r\nTIME\r\n")
        finally:
            self._free.append(connection)
            self._slots.give()

    def _take(self) -> Any:
        if self._free:
            return self._free.pop()
        connection = self._pool.make_connection()
        self._made.append(connection)
        return connection

    async def _round_trip(self, connection: Any, command: bytes) -> Any:
        async def once() -> Any:
            await connection.send_packed_command(command, False)
            return await connection.read_response()

        async def closing(error: Exception) -> None:
            await connection.disconnect()

        return await connection.retry.call_with_retry(once, closing)

    async def close(self) -> None:
        """Close every connection made (the store is closing)."""
        made, self._made, self._free = self._made, [], []
        for connection in made:
            await connection.disconnect()


async def routed_call(
    client: Any,
    script: Script,
    key: bytes,
    args: tuple[str | bytes, ...],
    *,
    replicas: int,
    timeout_ms: int,
    cluster: bool,
    where: str,
) -> Any:
    """The script's reply through redis-py's routing, where the store keeps it: a cluster,
    Sentinel, or ``replicas`` to ``WAIT`` for."""
    try:
        if replicas:
            route = run_on_key_primary if cluster else run_replicated
            return await route(
                client, script, key, args, replicas=replicas, timeout_ms=timeout_ms, where=where
            )
        return await client.execute_command("EVALSHA", script.sha, 1, key, *args)
    except NoScriptError:
        # This node restarted, was flushed or was promoted (a replica has no script cache):
        # EVAL runs and caches it again.
        return await client.execute_command("EVAL", script.source, 1, key, *args)
