from __future__ import annotations

import asyncio
import logging

import pytest

from idemstore import Sweeper
from idemstore.backends.memory import MemoryStore
from idemstore.testing import FakeClock
from tests.test_memory import complete_keys


async def test_sweeper_removes_expired_records_in_the_background() -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    await complete_keys(store, 5, retention=1)
    clock.advance(2)
    async with Sweeper(store, every=0.05, limit=2) as sweeper:
        for _ in range(100):
            if sweeper.removed == 5:
                break
            await asyncio.sleep(0.01)
        assert sweeper.running
    assert sweeper.removed == 5
    assert not sweeper.running


async def test_sweeper_survives_a_failing_sweep(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    class FlakyStore(MemoryStore):
        async def sweep(self, *, limit: int = 1000) -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise ConnectionError("engine went away")
            return await super().sweep(limit=limit)

    store = FlakyStore()
    with caplog.at_level(logging.ERROR, logger="idemstore.backends.sweeper"):
        async with Sweeper(store, every=0.02) as sweeper:
            for _ in range(100):
                if calls >= 3:
                    break
                await asyncio.sleep(0.01)
            assert sweeper.running
    assert calls >= 3
    assert "sweep failed" in caplog.text


def test_sweeper_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        Sweeper(MemoryStore(), every=0)
    with pytest.raises(ValueError):
        Sweeper(MemoryStore(), limit=0)
