"""One process of the replay-cache race: ``Idempotency.run`` through a ``CachedStore`` on every
key, several rounds of concurrent tasks, then a call with other arguments on each key.

Run as a module it prints one JSON line per execution, per result and per conflicting call,
then its cache's hit count; ``tests/test_replay_cache_processes.py`` starts two and reads them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


async def _racer(url: str, keys: list[str], rounds: int, tasks_per_key: int) -> None:
    from idemstore import ConflictError, Idempotency, fingerprint, open_store
    from idemstore.backends.cached import CachedStore

    pid = os.getpid()
    async with CachedStore(open_store(url), max_entries=1000) as store:
        idem = Idempotency(store, lease_ttl=30, retention=3600)

        async def one(key: str) -> None:
            async def work() -> bytes:
                print(json.dumps({"exec": key, "pid": pid}), flush=True)
                await asyncio.sleep(0.02)
                return f"{key} by {pid}".encode()

            result = await idem.run(key, fingerprint({"key": key}), work)
            print(json.dumps({"result": key, "value": result.value.decode()}), flush=True)

        async def other_arguments(key: str) -> None:
            async def never() -> bytes:
                print(json.dumps({"exec": key, "pid": pid, "other": True}), flush=True)
                return b"second"

            try:
                await idem.run(key, fingerprint({"key": key, "other": 1}), never)
            except ConflictError:
                print(json.dumps({"conflict": key}), flush=True)

        for _ in range(rounds):
            await asyncio.gather(*(one(k) for k in keys for _ in range(tasks_per_key)))
        await asyncio.gather(*(other_arguments(k) for k in keys))
        print(json.dumps({"hits": store.cache_info().hits}), flush=True)


if __name__ == "__main__":
    url, rounds, tasks, *race_keys = sys.argv[1:]
    asyncio.run(_racer(url, race_keys, int(rounds), int(tasks)))
