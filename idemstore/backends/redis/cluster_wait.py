"""Writes that wait for replicas on Redis Cluster: the script and ``WAIT`` on one connection
to the primary that owns the key's slot.

``WAIT`` counts the replicas that have every write sent on *its* connection so far. redis-py's
cluster client sends a keyless ``WAIT`` to its default node, which may not be the key's node
and never shares the script's connection, so its count says nothing of the write. The store
pipelines both through the key's node itself (``ClusterNode.execute_pipeline``: one
connection for the batch) and does the routing redis-py would do around a command: a
``MOVED`` updates the slot map and goes to the new owner, an ``ASK`` goes to the importing
node behind ``ASKING`` on the same connection, and a connection lost to a dead primary (or a
cluster that says it is down) refreshes the slot map, then fails the attempt for the store's
own retries (``TOPOLOGY_ERRORS``) to try again after their backoff.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import PipelineCommand
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from idemstore.backends.redis.replication import READS, check_confirmed
from idemstore.errors import StoreUnavailableError

if TYPE_CHECKING:
    from idemstore.backends.redis.scripts import Script

__all__ = ["TOPOLOGY_ERRORS", "run_on_key_primary"]

# After these the slot map may be stale (the key's primary died, or the cluster is electing a
# new one): the map is refreshed and the attempt fails, to be retried by the store.
TOPOLOGY_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    SlotNotCoveredError,
    TryAgainError,
)
# Redirections followed within one attempt: one per move of the slot (redis-py follows up to
# 16 per command); more means the slot keeps moving, and the attempt fails.
_REDIRECTS = 5


async def run_on_key_primary(
    client: Any,
    script: Script,
    key: bytes,
    args: tuple[str | bytes, ...],
    *,
    replicas: int,
    timeout_ms: int,
    where: str,
) -> Any:
    """Run ``script`` on the primary of ``key``'s slot, then ``WAIT replicas timeout_ms`` on
    the same connection; fewer confirmations raise ``StoreUnavailableError`` as on Sentinel."""
    if script.sha in READS:
        return await client.execute_command("EVALSHA", script.sha, 1, key, *args)
    try:
        node = client.get_node_from_key(key)
    except SlotNotCoveredError:
        await _refresh_slots(client)
        raise
    asking = False
    body: tuple[Any, ...] = ("EVALSHA", script.sha)
    for _ in range(_REDIRECTS + 1):
        commands: list[tuple[Any, ...]] = [("ASKING",)] if asking else []
        commands += [(*body, 1, key, *args), ("WAIT", replicas, timeout_ms)]
        try:
            *_, reply, confirmed = await _pipelined(node, commands)
        except TOPOLOGY_ERRORS:
            await _refresh_slots(client)
            raise
        if isinstance(reply, NoScriptError):
            # This node restarted or was promoted (a replica has no script cache): EVAL
            # runs and caches it.
            body = ("EVAL", script.source)
            continue
        if isinstance(reply, MovedError):
            await _move_slot(client, reply)
            node, asking = client.get_node_from_key(key), False
            continue
        if isinstance(reply, AskError):
            # The slot is being migrated to a node the map may not have yet.
            asked = client.get_node(host=reply.host, port=reply.port)
            if asked is None:
                await _refresh_slots(client)
            node, asking = asked or client.get_node_from_key(key), asked is not None
            continue
        for answer in (reply, confirmed):
            if isinstance(answer, TOPOLOGY_ERRORS):
                await _refresh_slots(client)
            if isinstance(answer, BaseException):
                raise answer
        check_confirmed(confirmed, replicas=replicas, timeout_ms=timeout_ms, where=where)
        return reply
    raise StoreUnavailableError(
        f"redis store {where}: a key's slot moved more than {_REDIRECTS} times in one attempt "
        "(the cluster is resharding); try again"
    )


async def _pipelined(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` sent together on one connection of ``node``; each reply, or the error it
    raised."""
    batch = [PipelineCommand(position, *command) for position, command in enumerate(commands)]
    await node.execute_pipeline(batch)
    return [command.result for command in batch]


async def _move_slot(client: Any, moved: MovedError) -> None:
    """Point the slot ``moved`` names at its new owner, as redis-py does on a ``MOVED``.
    (``move_slot`` is a coroutine in redis-py 8, a plain method before; older versions have
    none, and the whole map is read again.)"""
    move = getattr(client.nodes_manager, "move_slot", None)
    if move is None:
        await _refresh_slots(client)
    elif inspect.isawaitable(done := move(moved)):
        await done


async def _refresh_slots(client: Any) -> None:
    """Ask the cluster for its slot map again. A failure here leaves the old map: the error
    that led here is the one raised, and the next attempt refreshes again."""
    with contextlib.suppress(RedisError, RedisClusterException, OSError):
        await client.nodes_manager.initialize()
