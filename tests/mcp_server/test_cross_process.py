"""Two server processes sharing one store deduplicate between them (a stateless deployment)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import backend_unavailable
from tests.loopback_process import ENV, ROOT
from tests.mcp_server.conftest import call, error_of, unmarked

if TYPE_CHECKING:
    from pathlib import Path

SHARED_STORE_FIXTURE = "sqlite_file_store_url"


def shared_store_url(request: pytest.FixtureRequest) -> str:
    try:
        return str(request.getfixturevalue(SHARED_STORE_FIXTURE))
    except pytest.FixtureLookupError:
        backend_unavailable("sqlite", f"no {SHARED_STORE_FIXTURE} fixture on this branch")


@dataclass
class Replicas:
    """Server processes of one adapter, all on one shared store and writing the tools they
    run to one log: a stateless deployment's replicas."""

    adapter: str
    store_url: str
    log: Path

    def client(self, scope: str | None = "team-1") -> Client:
        """A client of a new server process (started when the client is entered)."""
        args = ["-m", "tests.mcp_server.servers", self.adapter, self.store_url, str(self.log)]
        options = [] if scope is None else ["--scope", scope]
        return Client(
            StdioServerParameters(
                command=sys.executable, args=[*args, *options], env=ENV, cwd=str(ROOT)
            )
        )

    def executions(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@pytest.fixture
def replicas(request: pytest.FixtureRequest, tmp_path: Path, adapter: str) -> Replicas:
    return Replicas(adapter, shared_store_url(request), tmp_path / "executions.log")


@pytest.mark.slow
async def test_two_server_processes_on_one_store_run_a_key_once(replicas: Replicas) -> None:
    async with replicas.client() as one, replicas.client() as two:
        first = await call(one, "charge", {"amount": 5}, key="order-1")
        # The retry lands on the other process: it replays, it does not run.
        assert unmarked(await call(two, "charge", {"amount": 5}, key="order-1")) == first
        assert replicas.executions() == ["charge"]
        error = error_of(await call(two, "charge", {"amount": 6}, key="order-1"))
        assert error["data"]["type"] == "idempotency_key_conflict"

        # Concurrent duplicates on both processes: one runs, the other is told it is in
        # progress (or, if it came second, gets the replay).
        outcomes: dict[str, Any] = {}

        async def send(name: str, client: Client) -> None:
            outcomes[name] = await call(
                client, "slow", {"amount": 1, "seconds": 1.0}, key="order-2"
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "one", one)
            tg.start_soon(send, "two", two)
        assert replicas.executions().count("slow") == 1
        results = [o for o in outcomes.values() if isinstance(o, dict)]
        assert results, outcomes
        for outcome in outcomes.values():
            if not isinstance(outcome, dict):
                assert error_of(outcome)["data"]["type"] == "idempotency_key_in_progress"
        replay_one = await call(one, "slow", {"amount": 1, "seconds": 1.0}, key="order-2")
        replay_two = await call(two, "slow", {"amount": 1, "seconds": 1.0}, key="order-2")
        assert unmarked(replay_one) == unmarked(replay_two) == results[0]
    assert replicas.executions().count("slow") == 1


@pytest.mark.slow
async def test_replicas_without_a_scope_option_run_a_key_once(replicas: Replicas) -> None:
    # The documented stateless multi-replica set-up: one shared store, no scope=. The default
    # scope is the same in every replica (and after a restart), not a value per process.
    async with replicas.client(scope=None) as one:
        first = await call(one, "charge", {"amount": 5}, key="order-1")
    # The first replica is gone (a restart); the retry lands on another process.
    async with replicas.client(scope=None) as two:
        assert unmarked(await call(two, "charge", {"amount": 5}, key="order-1")) == first
    assert replicas.executions() == ["charge"]
