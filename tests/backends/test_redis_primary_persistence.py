"""A store with ``wait_replicas`` checks the primary's persistence when it connects: a primary
that would come back empty after a restart (and empty its replicas on resync) is refused by
default, accepted knowingly with ``volatile_primary=warn|allow``, and what cannot be read
(CONFIG refused) is said once. The loss itself is in tests/reliability/test_redis_sentinel.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ConfigurationError, open_store
from idemstore.local_servers.redis import start_redis
from idemstore.testing.fixtures import running

pytest.importorskip("redis", reason="redis-py is not installed: pip install '.[redis]'")

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.local_servers.redis import LocalRedis
    from idemstore.protocol import Store

# The replica confirms in milliseconds; the timeout leaves room for a loaded CI machine (it
# failed at 0.5 s while both cores ran other suites) and stays under socket_timeout.
WAIT = "wait_replicas=1&wait_replicas_timeout=3"
LOGGER = "idemstore.redis"


def _with_replica(appendonly: bool) -> Iterator[LocalRedis]:
    with (
        running("redis", lambda: start_redis(appendonly=appendonly)) as primary,
        running("redis", lambda: start_redis(appendonly=appendonly)) as replica,
    ):
        replica.cli("REPLICAOF", "127.0.0.1", str(primary.port))
        deadline = time.monotonic() + 20
        while "master_link_status:up" not in replica.cli("INFO", "replication"):
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        yield primary


@pytest.fixture(scope="module")
def volatile_primary() -> Iterator[LocalRedis]:
    """A primary with no persistence (no AOF, no RDB snapshots) and one replica."""
    yield from _with_replica(appendonly=False)


@pytest.fixture(scope="module")
def aof_primary() -> Iterator[LocalRedis]:
    """A primary with ``appendonly yes`` and one replica."""
    yield from _with_replica(appendonly=True)


def url_of(server: LocalRedis, options: str, user: str = "") -> str:
    return (
        f"redis://{user}127.0.0.1:{server.port}/0?{WAIT}&prefix=t-{uuid.uuid4().hex[:8]}:&{options}"
    )


async def complete_some(store: Store, count: int = 20) -> None:
    async def one() -> None:
        key = uuid.uuid4().hex
        reservation = await store.reserve(key, "fp", lease_ttl=10, retention=60)
        assert reservation.lease is not None
        assert await store.complete(reservation.lease, b"ok")

    await asyncio.gather(*(one() for _ in range(count)))


async def warned_while_completing(url: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the store logged at WARNING while it opened at ``url`` and completed some keys."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        async with open_store(url) as store:
            await complete_some(store)
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def config_gets(server: LocalRedis) -> int:
    """How many ``CONFIG GET`` the server ran since its stats were reset."""
    for line in server.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_config|get:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def test_a_store_waiting_for_replicas_refuses_a_primary_without_persistence(
    volatile_primary: LocalRedis,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        async with open_store(url_of(volatile_primary, "")):
            pass
    message = str(refused.value)
    assert "no persistence" in message
    assert "appendonly yes" in message and "volatile_primary=warn" in message


async def test_a_primary_with_only_rdb_snapshots_is_refused_too() -> None:
    with running("redis", start_redis) as server:
        server.cli("CONFIG", "SET", "save", "3600 1")
        with pytest.raises(ConfigurationError, match="only RDB snapshots"):
            async with open_store(url_of(server, "")):
                pass


async def test_volatile_primary_warn_opens_and_says_so_once_per_primary(
    volatile_primary: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    warnings = await warned_while_completing(
        url_of(volatile_primary, "volatile_primary=warn"), caplog
    )
    assert len(warnings) == 1, warnings
    assert "no persistence" in warnings[0]


async def test_volatile_primary_allow_opens_without_checking(
    volatile_primary: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    volatile_primary.cli("CONFIG", "RESETSTAT")
    url = url_of(volatile_primary, "volatile_primary=allow")
    assert await warned_while_completing(url, caplog) == []
    assert config_gets(volatile_primary) == 0


async def test_a_primary_with_aof_is_accepted_silently_and_checked_once_not_per_call(
    aof_primary: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    aof_primary.cli("CONFIG", "RESETSTAT")
    assert await warned_while_completing(url_of(aof_primary, ""), caplog) == []
    # One check of the one primary: CONFIG GET appendfsync and save, on its first connection.
    assert config_gets(aof_primary) == 2


async def test_without_config_the_check_reads_info_and_says_what_it_could_not_check(
    aof_primary: LocalRedis, volatile_primary: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # A user that may not run CONFIG, as on managed Redis where CONFIG is renamed or disabled.
    for server in (aof_primary, volatile_primary):
        server.cli("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-config")
    warnings = await warned_while_completing(url_of(aof_primary, "", user="app:secret@"), caplog)
    assert len(warnings) == 1, warnings
    assert "could not check" in warnings[0] and "CONFIG GET appendfsync" in warnings[0]
    assert "secret" not in warnings[0]
    # INFO alone still shows a primary without AOF.
    with pytest.raises(ConfigurationError, match="AOF off"):
        async with open_store(url_of(volatile_primary, "", user="app:secret@")):
            pass


async def test_a_primary_that_answers_neither_info_nor_config_is_not_refused_but_said_so(
    volatile_primary: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    cli = ("ACL", "SETUSER", "blind", "on", ">secret", "~*", "&*", "+@all", "-config", "-info")
    volatile_primary.cli(*cli)
    warnings = await warned_while_completing(
        url_of(volatile_primary, "", user="blind:secret@"), caplog
    )
    assert len(warnings) == 1, warnings
    assert "at all, so it is not refused" in warnings[0]
    assert "INFO persistence" in warnings[0]


async def test_a_store_without_wait_replicas_does_not_check() -> None:
    with running("redis", start_redis) as server:
        server.cli("CONFIG", "RESETSTAT")
        async with open_store(f"{server.url}?prefix=t-x:") as store:
            await complete_some(store, 3)
        assert config_gets(server) == 0
