"""Race several OS processes on the same keys of one shared store and count executions.

Run as a module, this file is one racer: it runs ``Idempotency.run`` on every key with a few
concurrent tasks and prints one JSON line per execution and per result. ``race`` starts the
racers and gathers what they printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RaceReport:
    executions: Counter[str]
    values: dict[str, set[str]]
    errors: list[str]


async def _racer(url: str, keys: list[str], tasks_per_key: int, work_seconds: float) -> None:
    from idemstore import Idempotency, fingerprint, open_store

    pid = os.getpid()
    async with open_store(url) as store:
        idem = Idempotency(store, lease_ttl=30)

        async def one(key: str) -> None:
            async def work() -> bytes:
                print(json.dumps({"exec": key, "pid": pid}), flush=True)
                await asyncio.sleep(work_seconds)
                return f"{key} by {pid}".encode()

            result = await idem.run(key, fingerprint({"key": key}), work)
            print(json.dumps({"result": key, "value": result.value.decode()}), flush=True)

        await asyncio.gather(*(one(k) for k in keys for _ in range(tasks_per_key)))


def race(
    url: str,
    keys: list[str],
    *,
    processes: int = 4,
    tasks_per_key: int = 3,
    work_seconds: float = 0.05,
    timeout: float = 120,
    racers: tuple[str, ...] = ("tests.process_race",),
) -> RaceReport:
    """Start ``processes`` racers on ``keys`` of the store at ``url`` and count what ran.

    ``racers`` are the modules the processes run, taken in turn (another racer prints the
    same lines: ``tests/sync/sync_racer.py`` races the sync runner).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [
        url,
        str(tasks_per_key),
        str(work_seconds),
        *keys,
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", racers[i % len(racers)], *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    report = RaceReport(Counter(), {}, [])
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            report.errors.append(err[-2000:])
        for line in out.splitlines():
            event = json.loads(line)
            if "exec" in event:
                report.executions[event["exec"]] += 1
            else:
                report.values.setdefault(event["result"], set()).add(event["value"])
    return report


if __name__ == "__main__":
    url, tasks, seconds, *race_keys = sys.argv[1:]
    asyncio.run(_racer(url, race_keys, int(tasks), float(seconds)))
