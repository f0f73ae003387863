"""An endpoint that accepts connections and never answers fails the store within the
driver's connect bound, typed, saying it timed out connecting, and nothing tries again:
PostgreSQL's ``connect_timeout``, Redis's ``socket_connect_timeout``. With no option at all,
every engine with an endpoint (PostgreSQL, Redis, DynamoDB) gives up within 10 s; memory and
SQLite have no endpoint to wait on."""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

import pytest

from idemstore import StoreUnavailableError, open_store

FP = "f" * 64


class Silent(NamedTuple):
    driver: str
    url: str  # to the silent endpoint at {port}, with a password the error must never show
    says: tuple[str, ...]  # what the error says, the first as a regular expression
    opening: str = ""  # what entering the store adds to the URL


ENGINES = {
    # asyncpg's own bound on a connect: every host, the TLS request and its plain retry, the
    # login.
    "postgres": Silent(
        "asyncpg",
        "postgresql://app:secret@127.0.0.1:{port}/main?connect_timeout=0.2",
        ("timed out connecting", "connect_timeout (0.2 s"),
        # A larger pool connects its first connection alone: one that hangs ends the opening.
        opening="&pool_min_size=4&sslmode=disable",
    ),
    # Shorter than the socket_timeout (5 s), so the connect's own bound is the one that ends
    # it; retries=2, so a retry would show as a second connection.
    "redis": Silent(
        "redis",
        "redis://:secret@127.0.0.1:{port}/0?socket_connect_timeout=0.2&retries=2",
        ("within socket_connect_timeout",),
    ),
}


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> Silent:
    silent = ENGINES[request.param]
    pytest.importorskip(silent.driver)
    return silent


async def test_a_call_to_an_endpoint_that_never_answers_fails_saying_it_timed_out_connecting(
    silent_endpoint: tuple[int, list[asyncio.StreamWriter]], engine: Silent
) -> None:
    port, accepted = silent_endpoint
    store = open_store(engine.url.format(port=port))
    with pytest.raises(StoreUnavailableError, match=engine.says[0]) as raised:
        await store.reserve("k", FP, lease_ttl=60, retention=60)
    assert all(said in str(raised.value) for said in engine.says[1:])
    assert "secret" not in str(raised.value)
    assert len(accepted) == 1  # the bound ended the one attempt; nothing tried again
    await store.close()


async def test_entering_a_store_whose_endpoint_never_answers_fails_on_its_first_connect(
    silent_endpoint: tuple[int, list[asyncio.StreamWriter]], engine: Silent
) -> None:
    port, accepted = silent_endpoint
    with pytest.raises(StoreUnavailableError, match=engine.says[0]):
        async with open_store(engine.url.format(port=port) + engine.opening):
            pass
    assert len(accepted) == 1


# Each engine's URL with no timeout option: its defaults alone must bound the wait.
DEFAULTS = {
    "postgres": ("asyncpg", "postgresql://app:secret@127.0.0.1:{port}/main"),
    "redis": ("redis", "redis://:secret@127.0.0.1:{port}/0"),
    "dynamodb": (
        "aiobotocore",
        "dynamodb://idem?region=us-east-1&endpoint_url=http://127.0.0.1:{port}",
    ),
}
# What the defaults promise (docs/reliability.md, "Connect bounds").
WITHIN = 10.0


async def test_every_engine_gives_up_on_a_silent_endpoint_within_ten_seconds_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idemstore.testing.fixtures.dynamodb import DUMMY_AWS_ENV

    for name, value in DUMMY_AWS_ENV.items():  # signed requests, never to a real account
        monkeypatch.setenv(name, value)
    engines = {name: url for name, (driver, url) in DEFAULTS.items() if _installed(driver)}
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    async def gives_up(url: str) -> float:
        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        store = open_store(url.format(port=server.sockets[0].getsockname()[1]))
        started = time.monotonic()
        try:
            with pytest.raises(StoreUnavailableError):
                await store.reserve("k", FP, lease_ttl=60, retention=60)
            return time.monotonic() - started
        finally:
            await store.close()
            server.close()

    # All at once: the test lasts as long as the slowest engine's bound, not their sum.
    waited = await asyncio.gather(*(gives_up(url) for url in engines.values()))
    for writer in held:
        writer.close()
    assert {name: s < WITHIN for name, s in zip(engines, waited, strict=True)} == dict.fromkeys(
        engines, True
    ), dict(zip(engines, waited, strict=True))


def _installed(driver: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(driver) is not None
