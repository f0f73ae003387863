"""The crash proof of settling in a transaction: worker processes charge keys into a business
table inside the transaction that settles each key, while a nemesis SIGKILLs workers (a
replacement starts) and SIGSTOPs them past their lease, then SIGCONTs them: a paused owner
wakes up after a takeover and tries to commit. ``check`` then reads, for every key, the
business rows and the record. With ``steps``, each key is a workflow of that many steps, each
committing its row with its checkpoint (``charging_worker``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemstore import Status, open_store
from tests.settling.business import open_business

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proof:
    """What a run did and what it left."""

    events: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    retried: Counter[str] = field(default_factory=Counter)  # workers' retried errors, by kind
    checkpointed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # names, by key

    def summary(self) -> str:
        twice = sum(1 for n in self.rows.values() if n > 1)
        return (
            f"keys completed={len(self.completed)} business rows={sum(self.rows.values())}"
            f" keys charged twice={twice} commits={self.events['committed']}"
            f" takeovers={self.events['took']} (charged: {self.events['takeover']})"
            f" stale owners rolled back={self.events['stale']} SIGKILLs={self.events['kill']}"
            f" SIGSTOP/SIGCONTs={self.events['pause']} retried errors={dict(self.retried)}"
            + (
                f" steps committed={self.events['step']} resumed after a checkpoint="
                f"{self.events['resumed']} (steps skipped: {self.events['skipped']})"
                if self.checkpointed
                else ""
            )
        )


def _spawn(
    url: str, lease_ttl: float, work_seconds: float, steps: int, keys: list[str], out: Path
) -> Any:
    with out.open("a") as sink:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.settling.charging_worker",
                url,
                str(lease_ttl),
                str(work_seconds),
                str(steps),
                *keys,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
        )


def run(
    url: str,
    keys: list[str],
    *,
    workers: int = 3,
    faults: int = 6,
    lease_ttl: float = 0.5,
    work_seconds: float = 0.2,
    seed: int = 29,
    timeout: float = 180.0,
    steps: int = 0,
) -> Proof:
    """Race ``workers`` processes over ``keys`` under ``faults`` kills and pauses; then check."""
    nemesis = random.Random(seed)
    proof = Proof()
    with tempfile.TemporaryDirectory() as scratch:
        outputs: list[Path] = []
        output_of: dict[int, Path] = {}

        def start() -> Any:
            outputs.append(Path(scratch) / f"worker-{len(outputs)}.jsonl")
            proc = _spawn(url, lease_ttl, work_seconds, steps, keys, outputs[-1])
            output_of[proc.pid] = outputs[-1]
            return proc

        def ready(proc: Any) -> bool:
            # Connected and charging: a worker still starting up owns no key worth a fault.
            out = output_of[proc.pid]
            return proc.poll() is None and out.exists() and '"ready"' in out.read_text()

        live = [start() for _ in range(workers)]
        paused: set[int] = set()
        wakings: list[threading.Timer] = []

        def wake(victim: Any) -> None:
            victim.send_signal(signal.SIGCONT)
            paused.discard(victim.pid)

        deadline = time.monotonic() + timeout
        done = 0
        while done < faults and time.monotonic() < deadline:
            time.sleep(nemesis.uniform(0.1, 0.3))
            if not any(p.poll() is None for p in live):
                break
            running = [p for p in live if p.pid not in paused and ready(p)]
            if not running:
                continue
            done += 1
            victim = nemesis.choice(running)
            if nemesis.random() < 0.5:
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                live.remove(victim)
                live.append(start())
                proof.events["kill"] += 1
            else:
                # Paused past its lease, then woken while the nemesis goes on.
                victim.send_signal(signal.SIGSTOP)
                paused.add(victim.pid)
                waking = threading.Timer(lease_ttl * nemesis.uniform(1.5, 3.0), wake, (victim,))
                waking.start()
                wakings.append(waking)
                proof.events["pause"] += 1
        for waking in wakings:
            waking.join()
        for proc in live:
            try:
                _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                proof.errors.append("a worker did not finish in time")
            if proc.returncode != 0:
                proof.errors.append(err[-2000:])
        for out in outputs:
            for line in out.read_text().splitlines():
                event = json.loads(line)
                kind = next(iter(event))
                proof.events[kind] += 1
                if kind == "error":
                    proof.retried[event["why"].split(":")[0]] += 1
                if kind == "committed" and event["takeover"]:
                    proof.events["takeover"] += 1
                if kind == "resumed":
                    proof.events["skipped"] += event["skipped"]
    asyncio.run(_check(url, keys, proof))
    return proof


async def _check(url: str, keys: list[str], proof: Proof) -> None:
    business = await open_business(url)
    try:
        proof.rows = await business.charges()
    finally:
        await business.close()
    async with open_store(url) as store:
        for key in keys:
            record = await store.get(key)
            if record is not None and record.status is Status.COMPLETED:
                proof.completed.add(key)
            if record is not None and record.checkpoints:
                proof.checkpointed[key] = tuple(c.name for c in record.checkpoints)
