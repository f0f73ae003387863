"""Shared by the reliability tests: the seed of each randomized run, and where runs report."""

from __future__ import annotations

import json
import os
import random
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The run's random seed: IDEMSTORE_RELIABILITY_SEED to replay one, else a fresh one,
    shown in the test's report so a failure can be replayed."""
    value = int(os.environ.get("IDEMSTORE_RELIABILITY_SEED") or random.randrange(2**31))
    request.node.user_properties.append(("seed", value))
    print(f"seed={value}")
    return value


@pytest.fixture
def kills() -> int:
    """How many workers a SIGKILL history run kills: a short run in the test command, at
    least 100 per engine in the campaign (IDEMSTORE_RELIABILITY_KILLS, scripts/reliability)."""
    return int(os.environ.get("IDEMSTORE_RELIABILITY_KILLS") or 6)


@pytest.fixture
def pauses() -> int:
    """How many times a pause history run freezes a worker past its lease (SIGSTOP, then
    SIGCONT): a few in the test command, more in the campaign (IDEMSTORE_RELIABILITY_PAUSES,
    scripts/reliability-campaign)."""
    return int(os.environ.get("IDEMSTORE_RELIABILITY_PAUSES") or 3)


@pytest.fixture
def report_counts(request: pytest.FixtureRequest) -> Callable[[dict[str, Any]], None]:
    """Append a run's counts as one JSON line to $IDEMSTORE_RELIABILITY_REPORT (when set):
    docs/reliability.md takes its numbers from there."""

    def write(counts: dict[str, Any]) -> None:
        print(json.dumps(counts, default=str))
        target = os.environ.get("IDEMSTORE_RELIABILITY_REPORT")
        if target:
            with open(target, "a", encoding="utf-8") as out:
                out.write(json.dumps({"test": request.node.nodeid, **counts}, default=str) + "\n")

    return write
