"""One worker of the crash proof: charges each key into the business table inside the
transaction that settles it, until every key replays. Run as a module; prints one JSON line
per event: ``took`` (a takeover began), ``committed``, ``stale`` (a ``LeaseLostError`` rolled
its charge back), ``error`` (retried).

Usage: python -m tests.settling.charging_worker URL LEASE_TTL WORK_SECONDS KEY...
"""

from __future__ import annotations

import asyncio
import json
import sys

from idemstore import ExecutionPolicy, LeaseLostError, Replay, open_store
from tests.settling.business import open_business

FP = "charge"


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def charge_every_key(
    url: str, lease_ttl: float, work_seconds: float, keys: list[str]
) -> None:
    async with open_store(url) as store:
        business = await open_business(url)
        await store.get(keys[0])  # connected: the nemesis may start
        say(ready=True)
        policy = ExecutionPolicy(store, lease_ttl=lease_ttl, in_flight="wait")
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
    url, lease, work, *worker_keys = sys.argv[1:]
    asyncio.run(charge_every_key(url, float(lease), float(work), worker_keys))
