# ruff: noqa: B023, E741 (a measurement script, kept as it ran)
"""Redis replays at C concurrent callers (default 32): the floor (redis-py SET NX PX on fresh
keys, the bench's replay floor), idemstore's @idempotent and idemkit's @idempotent, the same
function and keys as the peers scenario, in interleaved rounds; prints p50 and ops/s of each
and both ratios to the floor. Usage (docs/benchmarks.md, issue #46):

    URL=redis://127.0.0.1:6379/0 C=32 ROUNDS=6 SECS=0.4 python scripts/issue-46/replay_at_32.py
"""

import asyncio
import os
import secrets
import time

import redis.asyncio as r

from idemstore.bench import peers_scenario as ps

URL = os.environ.get("URL", "redis://127.0.0.1:26379/0")
C = int(os.environ.get("C", "32"))
ROUNDS = int(os.environ.get("ROUNDS", "8"))
SECS = float(os.environ.get("SECS", "0.5"))
KEYS = 256


async def main():
    sides = {
        "idemstore": await ps._idemstore_async(URL),
        "idemkit": await ps._idemkit("redis", URL),
    }
    run = secrets.token_hex(3)
    for _name, side in sides.items():
        for k in range(KEYS):
            await side.call(f"{run}-{k}")
    cli = r.Redis.from_url(URL, max_connections=100)

    async def floor(key):
        await cli.set(f"fl:{run}:{key}", b"v" * 8, nx=True, px=600000)

    calls = {
        "floor": floor,
        **{n: (lambda s: lambda key: s.call(key))(s) for n, s in sides.items()},
    }
    lat = {n: [] for n in calls}
    ops = {n: [0, 0.0] for n in calls}
    names = list(calls)
    for rnd in range(ROUNDS):
        order = names[rnd % 3 :] + names[: rnd % 3]
        for n in order:
            call = calls[n]
            deadline = time.perf_counter() + SECS
            clock = time.perf_counter_ns

            async def worker(w):
                i = 0
                while time.perf_counter() < deadline:
                    key = f"{run}-{(w * 7 + i) % KEYS}" if n != "floor" else f"{rnd}-{w}-{i}"
                    b = clock()
                    await call(key)
                    lat[n].append(clock() - b)
                    i += 1
                return i

            t0 = time.perf_counter()
            done = await asyncio.gather(*(worker(w) for w in range(C)))
            ops[n][0] += sum(done)
            ops[n][1] += time.perf_counter() - t0
    res = {}
    for n in names:
        l = sorted(lat[n])
        res[n] = (l[len(l) // 2] / 1e6, ops[n][0] / ops[n][1])
    fl = res["floor"]
    print(
        " ".join(
            f"{n}: p50 {p:.3f}ms {o:.0f}ops/s x{p / fl[0]:.2f}p50 x{fl[1] / o:.2f}ops"
            for n, (p, o) in res.items()
        )
    )
    for s in sides.values():
        await s.close()
    await cli.aclose()


asyncio.run(main())
