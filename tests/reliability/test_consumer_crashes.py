"""Consumers SIGKILLed mid-handler and SIGSTOPped past their lease while a producer sends
every event twice: each event's effect exactly once, nothing lost, nothing stuck, per broker
(a small run; ``scripts/consumer-crashes`` runs a larger one)."""

from __future__ import annotations

import importlib.util

import pytest

from idemstore.local_servers import find_binary
from idemstore.testing.fixtures import backend_unavailable
from tests.reliability.consumer_crashes import BROKERS, campaign

NEEDS = {
    "sqs": ("moto", None),
    "redis": ("redis", "redis-server"),
    "rabbitmq": ("aio_pika", "rabbitmq-server"),
    "nats": ("nats", "nats-server"),
}


def need(broker: str) -> None:
    """Skip, or fail under IDEMSTORE_TEST_REQUIRE_ALL=1, unless ``broker`` can run here."""
    driver, binary = NEEDS[broker]
    if importlib.util.find_spec(driver) is None:
        backend_unavailable(broker, f"{driver} is not installed")
    if binary and find_binary(binary, "/usr/lib/rabbitmq/bin") is None:
        backend_unavailable(broker, f"{binary} is not on PATH")


@pytest.mark.parametrize("broker", BROKERS)
def test_every_event_takes_effect_once_through_kills_and_pauses(broker: str) -> None:
    need(broker)
    result = campaign(broker, events=20, workers=3, kills=2, pauses=1, timeout=60)
    assert result["ok"], result
    assert result["exactly_once"] == 20
    assert result["kills"] == 2 and result["pauses"] == 1
