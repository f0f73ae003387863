"""The clocks a PostgreSQL store reaches, for the clock-skew check (``backends.clock_skew``).

Leases are compared with ``clock_timestamp()`` on the server that runs the statement: the
primary the pool reaches. A failover moves them onto a standby's clock, so when the store URL
lists several hosts (``h1:5432,h2:5432``, the form that follows a promotion) each host is read
too, on a short connection of its own that accepts a standby (``target_session_attrs=any``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

from idemstore.backends.clock_skew import ClockWatch

if TYPE_CHECKING:
    from idemstore.backends.clock_skew import NodeClock

__all__ = ["NOW", "PostgresClocks"]

# The statement's own clock, not the transaction's start: what a lease is compared with.
NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"


def listed_hosts(dsn: str) -> list[tuple[str, int]]:
    """The hosts of a DSN that lists several (libpq's ``h1:5432,h2:5432``); none otherwise."""
    netloc = urlsplit(dsn).netloc.rpartition("@")[2]
    if "," not in netloc:
        return []
    hosts = []
    for host in netloc.split(","):
        parsed = urlsplit(f"//{host}")
        hosts.append((parsed.hostname or "", parsed.port or 5432))
    return hosts


class PostgresClocks(ClockWatch):
    """The clock watch of a PostgreSQL store: the pool's server, and every listed host (the
    server among them, read twice)."""

    __slots__ = ("_connect_timeout", "_dsn", "_hosts", "_timeout")

    def __init__(self, where: str, dsn: str, given: dict[str, Any]) -> None:
        super().__init__(
            f"postgres store {where}",
            bound=given["max_clock_skew"],
            policy=given["clock_skew_policy"],
            interval=given["clock_check_interval"],
        )
        self._dsn = dsn
        self._hosts = listed_hosts(dsn)
        self._connect_timeout: float = given["connect_timeout"]
        self._timeout: float = given["connect_timeout"] + given["command_timeout"]

    async def opened(self, pool: Any) -> None:
        """Check at once on a new pool, then every interval."""
        if not self.enabled:
            return
        try:
            # The server's reading is the pool's first round trip: its error is the open's.
            await self.check(lambda: self._nodes(pool), strict_first=True)
        except BaseException:
            pool.terminate()
            raise
        self.start(lambda: self._nodes(pool))

    async def _nodes(self, pool: Any) -> list[NodeClock]:
        listed = [(f"{host}:{port}", self._on_host(host, port)) for host, port in self._hosts]
        return [("server", self._on_pool(pool)), *listed]

    def _on_pool(self, pool: Any) -> Any:
        async def read() -> float:
            async with asyncio.timeout(self._timeout):
                return float(await pool.fetchval(NOW))

        return read

    def _on_host(self, host: str, port: int) -> Any:
        async def read() -> float:
            async with asyncio.timeout(self._timeout):
                connection = await asyncpg.connect(
                    self._dsn,
                    host=host,
                    port=port,
                    target_session_attrs="any",
                    timeout=self._connect_timeout,
                )
                try:
                    return float(await connection.fetchval(NOW))
                finally:
                    await connection.close()

        return read
