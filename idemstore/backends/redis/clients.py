"""How the store's redis-py clients are built: the driver's options, its retries, a handshake
bounded by the connect timeout, and the client for a single server, a Sentinel service or a
cluster."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from idemstore.backends.backoff import REDIS_TIMEOUTS
from idemstore.backends.redis.client_errors import CONNECT_TIMEOUT
from idemstore.backends.redis.options import TLS_SETTINGS
from idemstore.backends.redis.replication import sentinel_client

__all__ = [
    "data_options",
    "driver_options",
    "handshake_within_connect_timeout",
    "new_client",
    "retry_policy",
]


def retry_policy(retries: int, *errors: type[RedisError]) -> Retry:
    """redis-py's retries of ``errors``, with the store's backoff."""
    backoff = ExponentialBackoff(cap=REDIS_TIMEOUTS.cap, base=REDIS_TIMEOUTS.first / 2)
    return Retry(backoff, retries, supported_errors=errors)


def driver_options(
    username: str | None, password: str | None, given: dict[str, Any]
) -> dict[str, Any]:
    """What every redis-py client of the store is given."""
    options: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": given["socket_timeout"],
        "socket_connect_timeout": given["socket_connect_timeout"],
        # Responses are raw bytes: never let the driver decode them.
        "decode_responses": False,
        # redis-py retries connection errors itself, but not a connect that ran out of time
        # (the endpoint is down or hung: another try would only multiply the wait); a reply
        # that does not come in time is retried by _call.
        "retry": retry_policy(given["retries"], RedisConnectionError),
    }
    if given["ssl"]:
        options["ssl"] = True
        options.update({name: given[name] for name in TLS_SETTINGS})
    return options


def data_options(options: dict[str, Any], *, cluster: bool, db: int) -> dict[str, Any]:
    """The options of the store's data connections: ``options`` without a socket timeout
    (the store bounds each attempt itself) and, on a single server, the database and a
    handshake bounded by the connect timeout unless ``options`` names another connect
    function. RedisCluster takes no handshake of ours: the store bounds its discovery."""
    if not cluster:
        options = {"db": db, "redis_connect_func": handshake_within_connect_timeout, **options}
    return {**options, "socket_timeout": None}


async def handshake_within_connect_timeout(connection: Any) -> None:
    """redis-py's handshake (``HELLO``, ``AUTH``, ``SELECT``), within the connect timeout.

    redis-py bounds the TCP connect by ``socket_connect_timeout`` but waits for the
    handshake's replies like for any reply: on the data connections, which have no socket
    timeout, until the attempt's own timer. A listener that accepts and never answers must
    fail the connect like one that never accepts.
    """
    try:
        async with asyncio.timeout(connection.socket_connect_timeout):
            await connection.on_connect()
    except TimeoutError:
        raise RedisTimeoutError(CONNECT_TIMEOUT) from None


def new_client(
    nodes: list[tuple[str, int]],
    *,
    cluster: bool,
    sentinel_service: str | None,
    options: dict[str, Any],
    max_connections: int,
    ask_timeout: float,
) -> tuple[Any, Any]:
    """(the Sentinel client or None, the data client) for the store's nodes."""
    if cluster:
        return None, _cluster_client(nodes, options, max_connections)
    if sentinel_service is not None:
        return sentinel_client(
            nodes, sentinel_service, options, max_connections, ask_timeout=ask_timeout
        )
    host, port = nodes[0]
    return None, Redis(host=host, port=port, max_connections=max_connections, **options)


def _cluster_client(
    nodes: list[tuple[str, int]], options: dict[str, Any], max_connections: int
) -> Any:
    """A RedisCluster client; ``options["redis_connect_func"]`` (the persistence check of
    ``wait_replicas``), if any, runs on every connection it opens, to any node."""
    options = dict(options)
    connect = options.pop("redis_connect_func", None)
    startup = [ClusterNode(host, port) for host, port in nodes]
    client = RedisCluster(startup_nodes=startup, max_connections=max_connections, **options)
    if connect is not None:
        # RedisCluster takes no connect function as an argument, but makes every node's
        # connections from these keyword arguments: the nodes it will discover share the
        # client's dict, the startup nodes (asked for the slot map) have copies.
        client.get_connection_kwargs()["redis_connect_func"] = connect
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_kwargs["redis_connect_func"] = connect
    return client
