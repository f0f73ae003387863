"""The clocks a Redis store reaches, for the clock-skew check (``backends.clock_skew``).

A lease is a hash field compared with ``TIME`` inside the script, so the clocks that matter
are those of every node that may run the scripts: the server; on Sentinel, the primary and
the replicas the Sentinels name (one of them is promoted on a failover); on a Cluster, every
primary and replica the slot map lists. Each is read with ``TIME``, one round trip per node.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from idemstore.backends.clock_skew import ClockWatch

if TYPE_CHECKING:
    from idemstore.backends.clock_skew import NodeClock

__all__ = ["RedisClocks", "seconds_of_time"]


def seconds_of_time(reply: Any) -> float:
    """``TIME``'s reply (a pair, as redis-py parses it or raw; a one-node map on a cluster)
    as epoch seconds."""
    if isinstance(reply, dict):
        (reply,) = reply.values()
    whole, micros = reply
    return int(whole) + int(micros) / 1e6


class RedisClocks(ClockWatch):
    """The clock watch of a Redis store: which nodes to read, and how."""

    __slots__ = ("_options", "_own", "_service", "_ssl", "_timeout")

    def __init__(self, where: str, given: dict[str, Any], sentinel_service: str | None) -> None:
        super().__init__(
            f"redis store {where}",
            bound=given["max_clock_skew"],
            policy=given["clock_skew_policy"],
            interval=given["clock_check_interval"],
        )
        self._service = sentinel_service
        self._options: dict[str, Any] = {}
        self._own: Any = None
        self._ssl: bool = given["ssl"]
        self._timeout: float = given["socket_connect_timeout"] + given["socket_timeout"]

    async def opened(self, client: Any, sentinel: Any, own: Any = None) -> None:
        """Check at once on a new client (bounded: a node that does not answer in time is
        judged unreadable), then every interval. ``own``: the store's own connections
        (``ScriptCalls``), which read the server's clock when it has them, so the check opens
        no connection past the store's ``max_connections``."""
        if not self.enabled:
            return
        self._own = own
        # Other nodes are read on connections of their own, with the client's credentials
        # and TLS settings, without the primary's checks (redis_connect_func).
        made = client.get_connection_kwargs()
        self._options = {
            name: value
            for name, value in made.items()
            if name in ("username", "password", "socket_connect_timeout") or name.startswith("ssl_")
        }
        self._options["ssl"] = self._ssl
        # The primary's reading is the store's first round trip there: its error is the
        # open's (one connect, one timeout); a cluster's discovery already answered.
        cluster = hasattr(client, "get_primaries")
        await self.check(lambda: self._nodes(client, sentinel), strict_first=not cluster)
        self.start(lambda: self._nodes(client, sentinel))

    async def _nodes(self, client: Any, sentinel: Any) -> list[NodeClock]:
        if hasattr(client, "get_primaries"):  # a cluster: every node its primaries know
            return await self._cluster_nodes(client)
        nodes: list[NodeClock] = [("primary" if sentinel else "server", self._on(client))]
        if self._own is not None:
            nodes[0] = ("server", self._on_own(self._own))
        if sentinel is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout):
                    replicas = await sentinel.discover_slaves(self._service)
                nodes += [(f"{h}:{p} (replica)", self._on_node(h, p)) for h, p in replicas]
        return nodes

    async def _cluster_nodes(self, client: Any) -> list[NodeClock]:
        """Every node ``CLUSTER NODES`` lists as reachable (the slot map that redis-py keeps
        names the primaries only), read on a connection of its own."""
        try:
            async with asyncio.timeout(self._timeout):
                listed = await client.execute_command(
                    "CLUSTER NODES", target_nodes=client.get_primaries()[0]
                )
        except Exception:
            listed = {node.name: {"flags": node.server_type} for node in client.get_nodes()}
        nodes: list[NodeClock] = []
        for address, about in sorted(listed.items()):
            flags = str(about.get("flags", ""))
            if "fail" in flags or "noaddr" in flags or "handshake" in flags:
                continue
            host, _, port = address.split("@", 1)[0].rpartition(":")
            role = "replica" if "slave" in flags or "replica" in flags else "primary"
            nodes.append((f"{host}:{port} ({role})", self._on_node(host, int(port))))
        return nodes

    def _on(self, client: Any) -> Any:
        async def read() -> float:
            async with asyncio.timeout(self._timeout):
                return seconds_of_time(await client.execute_command("TIME"))

        return read

    def _on_own(self, own: Any) -> Any:
        async def read() -> float:
            async with asyncio.timeout(self._timeout):
                return seconds_of_time(await own.time(self._timeout))

        return read

    def _on_node(self, host: str, port: int) -> Any:
        async def read() -> float:
            replica = Redis(host=host, port=port, **{**self._options, "socket_timeout": None})
            try:
                async with asyncio.timeout(self._timeout):
                    reply = await replica.execute_command("TIME")  # type: ignore[no-untyped-call]
                    return seconds_of_time(reply)
            finally:
                await replica.aclose()

        return read
