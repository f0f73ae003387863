"""Measure (not a test) what Redis loses of acknowledged completions when its process gets
SIGKILL in the middle of a write load, per ``appendfsync`` setting.

Each trial starts a fresh ``redis-server`` with ``appendonly yes``, runs ``reserve`` +
``complete`` on new keys from several tasks, sends SIGKILL to the server while they run,
restarts it on the same data directory, and reads back every completion that was
acknowledged (``complete`` returned True). A SIGKILL of the process is not a power cut: what
Redis had written to the AOF but not fsynced is still in the kernel's page cache and survives.
A machine crash is not simulated here.

    PYTHONPATH=. python -m tests.reliability.everysec_loss [--trials 5] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import uuid

from idemstore import StoreUnavailableError, open_store
from idemstore.local_servers.redis import LocalRedis, start_redis


async def trial(server: LocalRedis, seconds: float, tasks: int) -> tuple[int, int]:
    """Acknowledged completions, and how many of them were gone after the restart."""
    url = f"{server.url}?retries=0&socket_timeout=2&socket_connect_timeout=1"
    acked: list[str] = []
    store = open_store(url)
    running = True

    async def writer() -> None:
        while running:
            key = uuid.uuid4().hex
            try:
                reservation = await store.reserve(key, "fp", lease_ttl=60, retention=3600)
                assert reservation.lease is not None
                if await store.complete(reservation.lease, b"paid"):
                    acked.append(key)
            except StoreUnavailableError:
                return

    workers = [asyncio.create_task(writer()) for _ in range(tasks)]
    await asyncio.sleep(seconds)
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)  # from inside the load, not after it
    running = False
    await asyncio.gather(*workers)
    await store.close()
    server.shutdown(kill=True)  # reap the process
    server.start()
    async with open_store(url) as store:
        lost = 0
        for key in acked:
            record = await store.get(key)
            if record is None or record.response != b"paid":
                lost += 1
    return len(acked), lost


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="load before the SIGKILL")
    parser.add_argument("--tasks", type=int, default=16)
    args = parser.parse_args()
    print("| persistence | trials | acknowledged completions | lost after SIGKILL + restart |")
    print("|---|---|---|---|")
    # The last row, without any persistence, shows the measurement does see losses.
    for setting in ("always", "everysec", None):
        total = lost = 0
        for _ in range(args.trials):
            if setting is None:
                server = start_redis(appendonly=False)
            else:
                server = start_redis(appendonly=True, appendfsync=setting)
            try:
                acked, gone = await trial(server, args.seconds, args.tasks)
            finally:
                server.stop()
            total += acked
            lost += gone
        label = "no AOF" if setting is None else f"appendonly yes, appendfsync {setting}"
        print(f"| {label} | {args.trials} | {total} | {lost} |")


if __name__ == "__main__":
    asyncio.run(main())
