"""A key's creation and a takeover each leave one structured line on ``idemstore.execution``:
key, scope and fence, so an operator can follow a key from the logs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from idemstore import Idempotency
from idemstore.backends.memory import MemoryStore

if TYPE_CHECKING:
    import pytest


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "idemstore.execution"]


async def work() -> bytes:
    return b"done"


async def test_reserving_a_key_logs_key_scope_and_fence_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with MemoryStore() as store:
        with caplog.at_level(logging.INFO, logger="idemstore.execution"):
            await Idempotency(store).run("order-1", "fp", work, scope="tenant-a")
            await Idempotency(store).run("order-1", "fp", work, scope="tenant-a")  # a replay
    (line,) = lines(caplog)
    assert line.levelno == logging.INFO and "order-1" in line.getMessage()
    fields = (line.idemstore_key, line.idemstore_scope, line.idemstore_fence)  # type: ignore[attr-defined]
    assert fields == ("order-1", "tenant-a", 1)
    assert line.idemstore_takeover is False  # type: ignore[attr-defined]


async def test_a_takeover_logs_at_warning_even_when_info_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    async with MemoryStore(clock=clock) as store:
        await store.reserve("order-2", "fp", lease_ttl=5, retention=60)  # its owner dies
        clock.now += 10
        with caplog.at_level(logging.WARNING, logger="idemstore.execution"):
            await Idempotency(store, lease_ttl=5).run("order-2", "fp", work)
    (line,) = lines(caplog)
    assert line.levelno == logging.WARNING and "taken over" in line.getMessage()
    assert (line.idemstore_fence, line.idemstore_takeover) == (2, True)  # type: ignore[attr-defined]
