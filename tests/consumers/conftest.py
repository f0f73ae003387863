"""Consumer-door tests: a fake delivery for the door's rules, and one broker per session
(started on loopback from the binaries on PATH) for the adapters."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import pytest

from idemstore.testing.fixtures import require_driver, running
from idemstore.testing.stores import WrappedStore
from tests.memory_store import store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore import Lease
    from idemstore.consumers import Message

__all__ = ["FakeDelivery", "PausedHeartbeats", "nats_url", "rabbitmq_url", "store"]


class PausedHeartbeats(WrappedStore):
    """A store whose heartbeats never arrive, as a stopped process's would not."""

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        await asyncio.sleep(10)
        return None


class FakeDelivery:
    """A delivery that records what the door asked of the broker."""

    def __init__(self, message: Message) -> None:
        self.message = message
        self.calls: list[tuple[str, float | None]] = []

    def said(self) -> list[str]:
        return [name for name, _ in self.calls if name != "keep"]

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def retry_later(self, delay: float) -> None:
        self.calls.append(("retry_later", delay))

    async def keep(self, seconds: float) -> None:
        self.calls.append(("keep", seconds))

    async def leave(self) -> None:
        self.calls.append(("leave", None))

    async def dead_letter(self) -> None:
        self.calls.append(("dead_letter", None))


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A RabbitMQ node of the session's own (``IDEMSTORE_TEST_RABBITMQ_URL``: an existing one)."""
    require_driver("rabbitmq", "aio_pika", "rabbitmq")
    existing = os.environ.get("IDEMSTORE_TEST_RABBITMQ_URL")
    if existing:
        yield existing
        return
    from idemstore.local_servers.rabbitmq import start_rabbitmq

    with running("rabbitmq", start_rabbitmq) as server:
        yield server.url


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """A JetStream server of the session's own (``IDEMSTORE_TEST_NATS_URL``: an existing one)."""
    require_driver("nats", "nats", "nats")
    existing = os.environ.get("IDEMSTORE_TEST_NATS_URL")
    if existing:
        yield existing
        return
    from idemstore.local_servers.nats import start_nats

    with running("nats", start_nats) as server:
        yield server.url
