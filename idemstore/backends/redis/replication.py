"""Redis with Sentinel, and writes that wait for replicas.

``redis+sentinel://HOST:PORT,HOST:PORT/SERVICE`` asks the Sentinels which server is the
primary of ``SERVICE``; every new connection asks again, so a failover is followed as soon as
the old primary's connections break. Replication is asynchronous: a promoted replica may miss
the last writes the old primary acknowledged. ``wait_replicas=N`` sends ``WAIT`` after every
write, on the same connection, so the write is acknowledged only once N replicas have it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import NoScriptError

from idemstore.backends.redis.scripts import SCRIPTS
from idemstore.errors import ConfigurationError, StoreUnavailableError

if TYPE_CHECKING:
    from idemstore.backends.redis.scripts import Script

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "READS",
    "check_confirmed",
    "run_replicated",
    "sentinel_client",
    "service_of",
]

DEFAULT_SENTINEL_PORT = 26379
# Reads need no replica: WAIT only follows the scripts that write.
READS = frozenset({SCRIPTS["get"].sha})


def service_of(path: str) -> str:
    """The monitored service a ``redis+sentinel://`` URL names as its path."""
    service = path.strip("/")
    if not service:
        raise ConfigurationError(
            "a redis+sentinel:// URL names the monitored service as its path: "
            "redis+sentinel://HOST:26379,HOST:26379/SERVICE"
        )
    return service


def sentinel_client(
    nodes: list[tuple[str, int]],
    service: str,
    options: dict[str, Any],
    max_connections: int,
    *,
    ask_timeout: float,
) -> tuple[Any, Any]:
    """The Sentinel handle (to close its connections) and a client of the current primary.

    The Sentinels get ``ask_timeout`` for their replies; the primary's connections take
    ``options`` as they are.
    """
    asking = {
        "socket_timeout": ask_timeout,
        "socket_connect_timeout": options["socket_connect_timeout"],
    }
    # Untyped before redis-py 8.2, typed since: the ignore holds for both.
    sentinel = Sentinel(nodes, **asking)  # type: ignore[no-untyped-call, unused-ignore]
    client = sentinel.master_for(
        service, redis_class=Redis, max_connections=max_connections, **options
    )
    return sentinel, client


async def run_replicated(
    client: Any,
    script: Script,
    key: bytes,
    args: tuple[str | bytes, ...],
    *,
    replicas: int,
    timeout_ms: int,
    where: str,
) -> Any:
    """Run ``script``, then ``WAIT replicas timeout_ms`` in one pipeline (one connection, so
    WAIT counts the replicas that have this very write)."""
    if script.sha in READS:
        return await client.execute_command("EVALSHA", script.sha, 1, key, *args)
    for command, body in (("EVALSHA", script.sha), ("EVAL", script.source)):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, body, 1, key, *args)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        reply, confirmed = await pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError):
            continue  # this node does not know the script (yet): EVAL caches it
        for answer in (reply, confirmed):
            if isinstance(answer, BaseException):
                raise answer
        check_confirmed(confirmed, replicas=replicas, timeout_ms=timeout_ms, where=where)
        return reply
    raise StoreUnavailableError(f"redis store {where} does not accept the script")


def check_confirmed(confirmed: Any, *, replicas: int, timeout_ms: int, where: str) -> None:
    """Raise unless ``WAIT`` answered that at least ``replicas`` replicas have the write."""
    if int(confirmed) < replicas:
        raise StoreUnavailableError(
            f"redis store {where}: the write reached the primary but only {confirmed} of "
            f"{replicas} replicas confirmed it within {timeout_ms} ms; treat it as unknown "
            "(a failover now could lose it)"
        )
