"""A PostgreSQL endpoint that accepts connections and never answers fails the store within
``connect_timeout``, typed, saying it timed out connecting."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from idemstore import StoreUnavailableError, open_store

if TYPE_CHECKING:
    import asyncio

pytest.importorskip("asyncpg")

FP = "f" * 64
# asyncpg's own bound on a connect: every host, the TLS request and its plain retry, the login.
SILENT = "connect_timeout=0.2"


async def test_a_call_to_an_endpoint_that_never_answers_fails_saying_it_timed_out_connecting(
    silent_endpoint: tuple[int, list[asyncio.StreamWriter]],
) -> None:
    port, accepted = silent_endpoint
    store = open_store(f"postgresql://app:secret@127.0.0.1:{port}/main?{SILENT}")
    with pytest.raises(StoreUnavailableError, match="timed out connecting") as raised:
        await store.reserve("k", FP, lease_ttl=60, retention=60)
    assert "connect_timeout (0.2 s" in str(raised.value)
    assert "secret" not in str(raised.value)
    assert len(accepted) == 1  # the bound ended the one attempt; nothing tried again
    await store.close()


async def test_entering_a_store_whose_endpoint_never_answers_fails_on_its_first_connect(
    silent_endpoint: tuple[int, list[asyncio.StreamWriter]],
) -> None:
    port, accepted = silent_endpoint
    # A larger pool connects its first connection alone: one that hangs ends the opening.
    url = f"postgresql://app@127.0.0.1:{port}/main?{SILENT}&pool_min_size=4&sslmode=disable"
    with pytest.raises(StoreUnavailableError, match="timed out connecting"):
        async with open_store(url):
            pass
    assert len(accepted) == 1
