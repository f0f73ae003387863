"""Whether the primary keeps what ``WAIT`` confirmed: its persistence, checked per primary.

``wait_replicas`` promises that a write survives the primary's loss, but only if the primary
cannot come back emptier than its replicas. A primary without persistence that restarts
before Sentinel fails it over comes back empty, still the primary; its replicas resync from
it and drop everything ``WAIT`` confirmed. RDB snapshots alone lose every write since the
last one the same way. So a store with ``wait_replicas`` reads the primary's persistence on
the first connection to each primary address (a failover to another address checks again),
never on the hot path, and refuses, warns or allows a volatile one (``volatile_primary``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from idemstore.backends.redis.client_errors import CONNECT_TIMEOUT
from idemstore.backends.redis.clients import handshake_within_connect_timeout
from idemstore.errors import ConfigurationError

__all__ = ["PrimaryPersistence", "Verdict", "judge"]

logger = logging.getLogger("idemstore.redis")

# One round trip: INFO is allowed nearly everywhere; CONFIG is often renamed or disabled on
# managed Redis, and then only INFO's aof_enabled is known.
_ASKED = (("INFO", "persistence"), ("CONFIG", "GET", "appendfsync"), ("CONFIG", "GET", "save"))

_FIX = (
    "Turn on AOF on the primary and its replicas (appendonly yes), or open the store with "
    "volatile_primary=warn (or allow) to accept that a restart of the primary before a "
    "failover loses acknowledged writes"
)


@dataclass(slots=True)
class Verdict:
    """What the primary's answers say: why it is volatile (``None``: it keeps acknowledged
    writes across a restart, or that is unknown) and what could not be checked."""

    volatile: str | None = None
    # Whether aof_enabled was read: without it nothing is known.
    known: bool = False
    unchecked: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _config_value(reply: Any) -> str | None:
    """The value of a one-parameter ``CONFIG GET`` (a list in RESP2, a map in RESP3)."""
    values = list(reply.values()) if isinstance(reply, dict) else list(reply[1::2])
    return _text(values[0]) if values else None


def _info_fields(info: Any) -> dict[str, str]:
    """``INFO``'s ``name:value`` lines."""
    lines = _text(info).splitlines()
    return dict(line.strip().split(":", 1) for line in lines if ":" in line and line[0] != "#")


def judge(info: Any, appendfsync: Any, save: Any) -> Verdict:
    """The verdict on the replies to ``_ASKED`` (each a reply, or the exception it raised)."""
    verdict = Verdict()
    for asked, reply in zip(_ASKED, (info, appendfsync, save), strict=True):
        if isinstance(reply, BaseException):
            verdict.unchecked.append(f"{' '.join(asked)} ({reply})")
    fsync = None if isinstance(appendfsync, BaseException) else _config_value(appendfsync)
    snapshots = None if isinstance(save, BaseException) else _config_value(save)
    aof = None if isinstance(info, BaseException) else _info_fields(info).get("aof_enabled")
    if aof is None:
        if not isinstance(info, BaseException):
            verdict.unchecked.append("aof_enabled (not in INFO persistence)")
        return verdict
    verdict.known = True
    if aof.strip() == "1":
        if fsync == "no":
            verdict.caveats.append(
                "appendfsync no: a crash of the machine (not only of Redis) can lose the "
                "acknowledged writes the OS had not flushed"
            )
        return verdict
    if snapshots:
        verdict.volatile = (
            f"the primary has AOF off and only RDB snapshots (save {snapshots!r}): a restart "
            "reloads the last snapshot and loses every write since"
        )
    elif snapshots is None:
        verdict.volatile = (
            "the primary has AOF off (aof_enabled:0): a restart loses every write since its "
            "last RDB snapshot, if it takes any"
        )
    else:
        verdict.volatile = (
            "the primary has no persistence (AOF off, no RDB snapshots): a restart brings it "
            "back empty"
        )
    return verdict


class PrimaryPersistence:
    """The store's connect function when ``wait_replicas`` is set: the handshake, then, on the
    first connection to each primary address, the persistence check of ``policy``."""

    __slots__ = ("_accepted", "_policy", "_told", "_where")

    def __init__(self, policy: str, where: str) -> None:
        self._policy = policy
        self._where = where
        # Addresses whose verdict is settled: checked again only when the primary moves.
        self._accepted: set[tuple[str, int]] = set()
        # What was logged, per address (a warning once, not once per connection).
        self._told: set[tuple[str, int]] = set()

    async def connect(self, connection: Any) -> None:
        """redis-py's ``redis_connect_func``: a connection refused here is closed first, so
        the pool never hands out one that skipped the check."""
        await handshake_within_connect_timeout(connection)
        address = (str(connection.host), int(connection.port))
        if self._policy == "allow" or address in self._accepted:
            return
        try:
            async with asyncio.timeout(connection.socket_connect_timeout):
                verdict = judge(*await _ask(connection))
        except TimeoutError:
            raise RedisTimeoutError(CONNECT_TIMEOUT) from None
        name = f"redis store {self._where} (primary {address[0]}:{address[1]})"
        if verdict.volatile is not None and self._policy == "refuse":
            await connection.disconnect()
            raise ConfigurationError(
                f"{name}: wait_replicas is set, but {verdict.volatile}; its replicas would then "
                f"resync from it and drop what WAIT confirmed. {_FIX}"
            )
        self._accepted.add(address)
        if address in self._told:
            return
        self._told.add(address)
        if verdict.volatile is not None:
            logger.warning(
                "%s: %s; acknowledged writes are lost if it restarts before a failover "
                "(volatile_primary=warn)",
                name,
                verdict.volatile,
            )
        if verdict.unchecked:
            # Unknown is not refused: a primary is refused only for what it said.
            how_far = "fully" if verdict.known else "at all, so it is not refused"
            logger.warning(
                "%s: could not check the primary's persistence %s; not read: %s",
                name,
                how_far,
                "; ".join(verdict.unchecked),
            )
        for caveat in verdict.caveats:
            logger.warning("%s: %s", name, caveat)


async def _ask(connection: Any) -> list[Any]:
    """The replies to ``_ASKED``, pipelined on the new connection; an error reply is kept as
    its exception (CONFIG may be refused while INFO answers)."""
    await connection.send_packed_command(connection.pack_commands(_ASKED))
    replies: list[Any] = []
    for _ in _ASKED:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies
