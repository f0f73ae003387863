"""One worker of the crash proof: charges each key into the business table inside the
transaction that settles it, until every key replays. Run as a module; prints one JSON line
per event: ``took`` (a takeover began), ``committed``, ``stale`` (a ``LeaseLostError`` rolled
its charge back), ``error`` (retried).

With STEPS above 0, each key is a workflow of that many steps: each step writes its row
(``KEY/step-N``) and its checkpoint in one transaction, the last one settles in it too, and an
owner that takes a key over resumes after its last checkpoint (``resumed``: steps skipped);
``step`` says a step committed.

Usage: python -m tests.settling.charging_worker URL LEASE_TTL WORK_SECONDS STEPS KEY...
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING

from idemstore import ExecutionPolicy, LeaseLostError, Replay, open_store
from tests.settling.business import Business, open_business

if TYPE_CHECKING:
    from idemstore import Execution

FP = "charge"


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def run_steps(
    claim: Execution, business: Business, key: str, steps: int, work_seconds: float
) -> None:
    """The workflow of ``key``, from the step after its last checkpoint; ``LeaseLostError``
    once fenced out (the step's transaction rolled back)."""
    names = [f"step-{n}" for n in range(1, steps + 1)]
    done = {checkpoint.name for checkpoint in claim.checkpoints}
    if done:
        say(resumed=key, skipped=len(done))
    for name in names:
        if name in done:
            continue
        await asyncio.sleep(work_seconds)  # the step's call out: a pause here outlives the lease
        await business.begin()
        try:
            await business.charge(f"{key}/{name}")
            await claim.checkpoint(name, connection=business.connection)
            if name == names[-1]:
                await claim.settle(b"shipped", connection=business.connection)
            await business.commit()
        except BaseException:
            await business.rollback()
            raise
        say(step=key, name=name, fence=claim.fence)


async def charge_every_key(
    url: str, lease_ttl: float, work_seconds: float, steps: int, keys: list[str]
) -> None:
    async with open_store(url) as store:
        business = await open_business(url)
        await store.get(keys[0])  # connected: the nemesis may start
        say(ready=True)
        # A workflow holds its key on failure: released, it would lose the checkpoints of
        # steps whose rows committed, and a retry would run them again.
        on_failure = "hold" if steps else "release"
        policy = ExecutionPolicy(
            store, lease_ttl=lease_ttl, in_flight="wait", on_failure=on_failure
        )
        # Every worker takes the keys in the same order: they queue on the key its owner
        # holds, so a paused owner's key is taken over, and the owner wakes up stale.
        pending = list(reversed(keys))
        while pending:
            key = pending.pop()
            try:
                claim = await policy.begin(key, FP)
                if isinstance(claim, Replay):
                    continue
                if claim.takeover:
                    say(took=key, fence=claim.fence)
                if steps:
                    try:
                        async with claim:
                            await run_steps(claim, business, key, steps, work_seconds)
                    except LeaseLostError:
                        say(stale=key)
                        pending.insert(0, key)
                        continue
                    say(committed=key, fence=claim.fence, takeover=claim.takeover)
                    continue
                async with claim:
                    # The call to the payment provider: a pause here outlives the lease.
                    await asyncio.sleep(work_seconds)
                    await business.begin()
                    try:
                        await business.charge(key)
                        await claim.settle(b"charged", connection=business.connection)
                        await business.commit()
                    except LeaseLostError:
                        # Fenced out by a takeover while paused: the charge must not commit.
                        await business.rollback()
                        say(stale=key)
                        pending.insert(0, key)  # the next begin replays the new owner's
                        continue
                    except BaseException:
                        await business.rollback()
                        raise
                say(committed=key, fence=claim.fence, takeover=claim.takeover)
            except Exception as exc:
                # A lock another (paused) worker holds, a busy file, a lease granted too late
                # to start on: try the key again later.
                say(error=key, why=f"{type(exc).__name__}: {exc}"[:300])
                pending.insert(0, key)
        await business.close()


if __name__ == "__main__":
    url, lease, work, steps, *worker_keys = sys.argv[1:]
    asyncio.run(charge_every_key(url, float(lease), float(work), int(steps), worker_keys))
