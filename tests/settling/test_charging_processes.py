"""Issue 29, across processes: worker processes charge keys inside the transaction that
settles them, racing on Postgres and on one SQLite file, with and without a nemesis that
SIGKILLs workers and SIGSTOPs them past their lease. For every key: exactly one business row
if and only if its record is completed, never two. ``IDEMSTORE_CRASH_PROOF_KEYS`` sets the
size (small by default, so the test command stays fast).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from tests.settling.business import open_business
from tests.settling.crash_proof import Proof, run

pytestmark = pytest.mark.slow

KEYS = int(os.environ.get("IDEMSTORE_CRASH_PROOF_KEYS", "12"))


@pytest.fixture(params=["postgres_store_url", "sqlite_file_store_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)

    async def create() -> None:
        business = await open_business(url)
        await business.create_table()
        await business.close()

    asyncio.run(create())
    return url


def keys(count: int) -> list[str]:
    return [f"charge-{uuid.uuid4().hex[:10]}" for _ in range(count)]


def assert_charged_once_iff_completed(proof: Proof, charged: list[str]) -> None:
    assert proof.errors == []
    assert {key: proof.rows.get(key, 0) for key in charged} == dict.fromkeys(charged, 1)
    assert proof.completed == set(charged)


def test_racing_processes_charge_each_key_once(store_url: str) -> None:
    charged = keys(8)
    proof = run(store_url, charged, workers=3, faults=0)
    assert_charged_once_iff_completed(proof, charged)
    assert proof.events["committed"] == len(charged)


def test_killed_and_paused_owners_never_charge_a_key_twice(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    charged = keys(KEYS)
    proof = run(store_url, charged, workers=3, faults=KEYS)
    with capsys.disabled():
        print(f"\ncrash proof on {store_url.split(':')[0]}: {proof.summary()}")
    assert_charged_once_iff_completed(proof, charged)
    # Every commit the workers saw is one row: a stale owner's commit never landed.
    assert proof.events["committed"] <= len(charged)


# -- a workflow of three steps with recovery points ---------------------------------------------

STEPS = ("step-1", "step-2", "step-3")


def assert_each_step_once_iff_checkpointed(proof: Proof, workflows: list[str]) -> None:
    assert proof.errors == []
    for key in workflows:
        rows = {name: proof.rows.get(f"{key}/{name}", 0) for name in STEPS}
        kept = proof.checkpointed.get(key, ())
        # A step's row committed exactly once if and only if its checkpoint did, never twice.
        assert rows == {name: int(name in kept) for name in STEPS}, (key, rows, kept)
        assert kept == STEPS[: len(kept)]
    # Every workflow ran to its end: completed, with all three steps.
    assert proof.completed == set(workflows)
    assert all(proof.checkpointed[key] == STEPS for key in workflows)


def test_killed_and_paused_owners_never_run_a_checkpointed_step_twice(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workflows = [f"flow-{uuid.uuid4().hex[:10]}" for _ in range(KEYS)]
    proof = run(store_url, workflows, workers=3, faults=KEYS, steps=3, work_seconds=0.1)
    with capsys.disabled():
        print(f"\nworkflow crash proof on {store_url.split(':')[0]}: {proof.summary()}")
    assert_each_step_once_iff_checkpointed(proof, workflows)
