"""History checking: workers log every attempt on shared keys; a checker proves the store's
promises from the logs.

A *worker* drives the store protocol directly (``reserve``/``extend``/``complete``/``release``,
so it knows every fence and owner token) over rounds of shared keys, with random work times,
short leases, heartbeats on some executions, and some executions that fail and release. It
writes one JSON line per event to its own file and flushes it at once, so a worker killed with
SIGKILL loses nothing it logged: in particular the ``reserve`` line of an acquisition is on disk
before the side effect starts, and the ``completing`` line (with the response) before
``complete`` is called.

Events (``ev``), all with ``w`` (worker log name), ``key``, ``m0``/``m1`` (``time.monotonic()``
immediately before the call was sent and after it returned: the only times the checker
reads) and ``t0``/``t1`` (the wall clock, for people reading the logs):

- ``reserve``: ``outcome`` acquired | replayed | in-progress | conflict, ``probe`` (reserved
  with other arguments, which must never acquire), ``fence``/``token`` (the lease's, or the
  existing record's), for acquired ``takeover``, ``lease_ttl`` and ``lease_expires_at`` (the
  store's deadline, never used to order anything), for a completed record ``response`` (hex).
- ``extend``: ``fence``, ``token``, ``lease_ttl``, ``lease_expires_at`` (``None`` when the
  lease was lost).
- ``completing``: ``fence``, ``token``, ``response``, ``m0``, written before ``complete`` is
  called.
- ``releasing``: ``fence``, ``token``, ``m0``, written before ``release`` is called (a worker
  killed after it may or may not have released).
- ``end``: ``fence``, ``token``, ``outcome`` completed | lost (``complete`` returned False) |
  unknown (``complete`` raised) | released | release-lost | release-unknown. An execution
  without an ``end`` was killed in mid-work.
- ``wait``: ``timeout``.
- ``error``: ``op``, ``error`` (the exception's class), ``typed`` (an ``IdemstoreError``),
  ``hang`` (the call outlived the worker's cap and was abandoned).

``run_history`` starts N worker processes, SIGKILLs workers that are in mid-work and restarts
them, freezes others past their lease (SIGSTOP, then SIGCONT, logged as ``pause`` events with
``victim`` and ``m0``/``m1`` in ``nemesis.jsonl``), runs an optional fault scenario alongside,
then lets a *finisher* worker (never killed) settle every key, reads the final records and
calls ``check_history``.

Run as a module, this file is one worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from idemstore import IdemstoreError, Outcome, Status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from idemstore import IdempotencyStore, Lease, Record

ROOT = Path(__file__).resolve().parents[2]

FINGERPRINT = "history-args"
OTHER_FINGERPRINT = "other-args"

# Engine timestamps are microseconds (Redis, Postgres) or floats; this absorbs rounding only.
CLOCK_TOLERANCE = 0.002


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker behaves. Work longer than the lease without a heartbeat lets the lease
    lapse, so another worker may take the key over and the first one's ``complete`` must be
    refused."""

    lease_ttl: float = 0.5
    retention: float = 3600.0
    work_min: float = 0.02
    work_max: float = 0.25
    long_work_probability: float = 0.2
    long_work_max: float = 1.2
    heartbeat_probability: float = 0.4
    release_probability: float = 0.08
    probe_probability: float = 0.2
    concurrency: int = 2
    error_pause: float = 0.05
    call_cap: float = 30.0


class HistoryLog:
    """One worker's JSON-lines file, flushed after every line."""

    __slots__ = ("_file", "name")

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, **event: Any) -> None:
        event["w"] = self.name
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def round_keys(prefix: str, round_number: int, count: int) -> list[str]:
    return [f"{prefix}r{round_number}-k{index}" for index in range(count)]


class Worker:
    """Settles keys on a store: every key ends completed (by this worker or a replay)."""

    __slots__ = ("_log", "_rng", "config", "store")

    def __init__(
        self, store: IdempotencyStore, log: HistoryLog, rng: random.Random, config: WorkerConfig
    ) -> None:
        self.store = store
        self.config = config
        self._log = log
        self._rng = rng

    async def run_rounds(
        self, prefix: str, keys_per_round: int, should_stop: Callable[[], bool]
    ) -> None:
        """Round after round of ``keys_per_round`` shared keys, until told to stop."""
        round_number = 0
        while True:
            await self.settle_all(round_keys(prefix, round_number, keys_per_round))
            if should_stop():
                return
            round_number += 1

    async def settle_all(self, keys: Iterable[str]) -> None:
        queue = list(keys)
        self._rng.shuffle(queue)

        async def drain() -> None:
            while queue:
                await self.settle(queue.pop())

        await asyncio.gather(*(drain() for _ in range(self.config.concurrency)))

    async def _call(
        self, op: str, key: str, make: Callable[[], Awaitable[Any]]
    ) -> tuple[bool, Any, dict[str, float]]:
        """Run one store call; log any exception (typed or not, or a hang) and report it.

        Also returns the call's stamps: ``m0``/``m1``, ``time.monotonic()`` immediately before
        the call is sent and after it returns (the checker's real-time bounds of the call), and
        ``t0``/``t1``, the wall clock, for people reading the logs.
        """
        # CLOCK_MONOTONIC is system-wide on Linux: every worker process (and the nemesis) reads
        # the same clock, so these stamps order calls across processes; the wall clock may be
        # stepped, and a stamp the store computes for a lease may be taken before sending.
        cap = self.config.call_cap
        timer = asyncio.timeout(cap)
        t0 = time.time()
        m0 = time.monotonic()
        try:
            async with timer:
                value = await make()
        except Exception as exc:
            m1 = time.monotonic()
            hang = timer.expired()
            self._log.write(
                ev="error",
                op=op,
                key=key,
                t0=t0,
                t1=time.time(),
                m0=m0,
                m1=m1,
                error=f"{type(exc).__module__}.{type(exc).__qualname__}",
                typed=isinstance(exc, IdemstoreError) and not hang,
                hang=hang,
                message=str(exc)[:300],
            )
            await asyncio.sleep(self.config.error_pause)
            return False, exc, {"t0": t0, "t1": time.time(), "m0": m0, "m1": m1}
        m1 = time.monotonic()
        return True, value, {"t0": t0, "t1": time.time(), "m0": m0, "m1": m1}

    async def _reserve(self, key: str, fingerprint: str) -> tuple[bool, Any, dict[str, float]]:
        config = self.config
        return await self._call(
            "reserve",
            key,
            lambda: self.store.reserve(
                key, fingerprint, lease_ttl=config.lease_ttl, retention=config.retention
            ),
        )

    def _log_acquired(
        self, key: str, stamps: dict[str, float], lease: Lease, *, probe: bool, **more: Any
    ) -> None:
        self._log.write(
            ev="reserve",
            key=key,
            **stamps,
            outcome="acquired",
            probe=probe,
            fence=lease.fence,
            token=lease.token,
            **more,
        )

    async def settle(self, key: str) -> None:
        config = self.config
        store = self.store
        while True:
            ok, reservation, stamps = await self._reserve(key, FINGERPRINT)
            if not ok:
                continue
            if reservation.outcome is Outcome.ACQUIRED:
                lease = reservation.lease
                self._log_acquired(
                    key,
                    stamps,
                    lease,
                    probe=False,
                    takeover=reservation.takeover,
                    lease_ttl=config.lease_ttl,
                    # The store's word, for people reading the logs; the checker never
                    # orders by it (on DynamoDB the client computes it before sending).
                    lease_expires_at=lease.lease_expires_at,
                )
                if await self._execute(lease):
                    break
                continue
            record = reservation.record
            self._log_record(key, stamps, reservation.outcome, record, probe=False)
            if reservation.outcome is Outcome.COMPLETED:
                break
            if reservation.outcome is Outcome.MISMATCH:
                return  # a bug (same arguments every time); the checker reports it
            timeout = config.lease_ttl * 2
            ok, _, stamps = await self._call(
                "wait", key, lambda: store.wait(key, timeout=config.lease_ttl * 2)
            )
            if ok:
                self._log.write(ev="wait", key=key, **stamps, timeout=timeout)
        if self._rng.random() < config.probe_probability:
            await self._probe(key)

    def _log_record(
        self,
        key: str,
        stamps: dict[str, float],
        outcome: Outcome,
        record: Record,
        *,
        probe: bool,
    ) -> None:
        self._log.write(
            ev="reserve",
            key=key,
            **stamps,
            outcome={
                Outcome.COMPLETED: "replayed",
                Outcome.IN_PROGRESS: "in-progress",
                Outcome.MISMATCH: "conflict",
            }[outcome],
            probe=probe,
            fence=record.fence,
            token=record.token,
            status=str(record.status),
            response=None if record.response is None else record.response.hex(),
        )

    async def _probe(self, key: str) -> None:
        """The same key with other arguments: must be refused, never acquired."""
        ok, reservation, stamps = await self._reserve(key, OTHER_FINGERPRINT)
        if not ok:
            return
        if reservation.outcome is Outcome.ACQUIRED:
            lease = reservation.lease
            self._log_acquired(key, stamps, lease, probe=True)
            await self._call("release", key, lambda: self.store.release(lease))
            return
        self._log_record(key, stamps, reservation.outcome, reservation.record, probe=True)

    async def _execute(self, lease: Lease) -> bool:
        """The side effect under ``lease``; True when this execution's result was stored."""
        config = self.config
        rng = self._rng
        key = lease.key
        held = [lease]
        stopping = asyncio.Event()
        beat = None
        if rng.random() < config.heartbeat_probability:
            beat = asyncio.create_task(self._heartbeat(held, stopping))
        if rng.random() < config.long_work_probability:
            work = rng.uniform(config.lease_ttl * 0.8, config.long_work_max)
        else:
            work = rng.uniform(config.work_min, config.work_max)
        try:
            await asyncio.sleep(work)  # the side effect
        finally:
            # On cancellation (an in-process "kill") the heartbeat dies with the work, as it
            # would with the process.
            if beat is not None:
                # The flag too: redis-py on Python 3.11 may swallow the cancel (see
                # tests/reliability/test_cancellation.py).
                stopping.set()
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
        lease = held[0]
        ids = {"key": key, "fence": lease.fence, "token": lease.token}
        if rng.random() < config.release_probability:
            # Stamped before the line is written, so before the release is sent: the earliest
            # moment it may have taken effect, even if this process dies right after.
            self._log.write(ev="releasing", **ids, t0=time.time(), m0=time.monotonic())
            ok, released, stamps = await self._call(
                "release", key, lambda: self.store.release(lease)
            )
            outcome = "release-unknown" if not ok else "released" if released else "release-lost"
            self._log.write(ev="end", **ids, **stamps, outcome=outcome)
            return False
        # Bytes a text codec would mangle: a replay must return exactly these.
        response = (
            json.dumps({**ids, "worker": self._log.name}).encode()
            + b"\x00\xff\r\n"
            + rng.randbytes(6)
        )
        self._log.write(
            ev="completing", **ids, t0=time.time(), m0=time.monotonic(), response=response.hex()
        )
        ok, stored, stamps = await self._call(
            "complete", key, lambda: self.store.complete(lease, response)
        )
        outcome = "unknown" if not ok else "completed" if stored else "lost"
        self._log.write(ev="end", **ids, **stamps, outcome=outcome)
        return ok and stored is True

    async def _heartbeat(self, held: list[Lease], stopping: asyncio.Event) -> None:
        ttl = self.config.lease_ttl
        while not stopping.is_set():
            await asyncio.sleep(ttl / 3)
            lease = held[0]
            ok, extended, stamps = await self._call(
                "extend", lease.key, functools.partial(self.store.extend, lease, lease_ttl=ttl)
            )
            if not ok:
                continue  # as the runner does: keep the lease we have, try on the next beat
            self._log.write(
                ev="extend",
                key=lease.key,
                fence=lease.fence,
                token=lease.token,
                **stamps,
                lease_ttl=ttl,
                lease_expires_at=None if extended is None else extended.lease_expires_at,
            )
            if extended is None:
                return
            held[0] = extended


# -- the checker ----------------------------------------------------------------------------


@dataclass
class _Execution:
    """One acquisition and what its owner did with it, in real time: every moment here is a
    ``time.monotonic()`` stamp a worker took around its own call (CLOCK_MONOTONIC is one clock
    for every process on a Linux machine, so stamps of different workers compare)."""

    key: str
    fence: int
    token: str
    worker: str
    takeover: bool
    lease_ttl: float
    # When the reserve call was sent and when it returned: the engine acted in between,
    # whatever stamp the client computed for the lease (or an SDK retry reused).
    called_at: float
    returned_at: float
    # When each extend the store granted was sent, and each it refused.
    extended_at: list[float] = field(default_factory=list)
    refused_at: list[float] = field(default_factory=list)
    completing: dict[str, Any] | None = None
    # When a release was sent (it may have taken effect from then on, even unlogged).
    releasing_at: float | None = None
    end: dict[str, Any] | None = None

    def lives_until(self, granted_before: float = math.inf) -> float:
        """The earliest moment this lease may lapse, counting the grants sent before
        ``granted_before``: the engine set each deadline after the call was sent, so it is at
        least the lease from the send (a later grant only moves it out)."""
        sent = [self.called_at, *(m for m in self.extended_at if m < granted_before)]
        return max(sent) + self.lease_ttl

    def gave_up(self) -> bool:
        """Released, or may have: a release that was sent may have taken effect even when the
        worker was killed before it logged the outcome."""
        if self.end is None:
            return self.releasing_at is not None
        return self.end["outcome"] in ("released", "release-unknown")

    def fenced_out(self) -> bool:
        """The store refused this owner something: an extend, its complete or its release."""
        ended = None if self.end is None else self.end["outcome"]
        return bool(self.refused_at) or ended in ("lost", "release-lost")


@dataclass
class HistoryReport:
    """What the logs show: counts, the longest calls, and every broken promise."""

    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    max_call_seconds: dict[str, float] = field(default_factory=dict)
    untyped_errors: list[str] = field(default_factory=list)
    # Filled by run_history: SIGKILLs sent, workers restarted, engine restarts and such.
    run: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The run's figures as one flat row, the shape ``report_counts`` writes."""
        return {**self.run, **self.counts, "max_call_seconds": self.max_call_seconds}

    def summary(self) -> str:
        return json.dumps(
            {
                "counts": dict(sorted(self.counts.items())),
                "run": self.run,
                "max_call_seconds": self.max_call_seconds,
            },
            default=str,
        )


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every event of every log; a torn last line (impossible with line flushes, but cheap to
    tolerate) is skipped."""
    events = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def check_history(events: list[dict[str, Any]], final: dict[str, Record | None]) -> HistoryReport:
    """Check every key's history against the store contract; ``final`` is each key's record
    read after all workers stopped.

    Time is real time only: each call is the interval between the worker's monotonic stamps
    around it (``m0`` sent, ``m1`` returned), and one call comes before another only when it
    returned before the other was sent; overlapping calls have no order to check. No stamp a
    client computed for a lease (``lease_expires_at``, taken before sending on DynamoDB and
    reused by SDK retries) orders anything.

    Per key: at most one ``complete`` returned True; a second execution only after the first
    released or its lease lapsed (then as a takeover), where a reserve that returned before
    the first lease could have lapsed (``lease_ttl`` after the last grant was sent) or before
    the release was sent is a duplicate; fences strictly rise in real time; no acquisition
    after a completion (no stale owner completed); a reserve sent after a completion was
    acknowledged sees that completion; the stored record is the one acknowledged completion,
    byte for byte (or, when no acknowledgement was logged, one that was attempted and not
    refused); every replay and every conflicting record equals it; a reserve with other
    arguments never acquires; every key ends completed.

    ``pause`` events (the runner's SIGSTOP/SIGCONT of a worker) are counted against the
    executions they froze: how many were frozen past their lease and were then fenced out.
    """
    report = HistoryReport()
    counts = report.counts
    violations = report.violations
    executions: dict[str, dict[tuple[int, str], _Execution]] = {}
    seen: dict[str, list[dict[str, Any]]] = {}
    pauses: list[dict[str, Any]] = []
    for event in events:
        kind = event["ev"]
        if kind == "pause":
            pauses.append(event)
            continue
        key = event["key"]
        if "m0" in event and "m1" in event:
            op = event.get("op", kind)
            if kind == "end":
                op = "release" if event["outcome"].startswith("release") else "complete"
            seconds = event["m1"] - event["m0"]
            report.max_call_seconds[op] = max(report.max_call_seconds.get(op, 0.0), seconds)
        if kind == "reserve":
            counts["attempts"] += 1
            if event["probe"]:
                counts["conflict probes"] += 1
            if event["outcome"] == "acquired":
                if event["probe"]:
                    violations.append(
                        f"{key}: a reserve with other arguments acquired fence {event['fence']}"
                    )
                    continue
                acquisitions = executions.setdefault(key, {})
                ident = (event["fence"], event["token"])
                if ident in acquisitions:
                    violations.append(f"{key}: fence {event['fence']} acquired twice by one token")
                acquisitions[ident] = _Execution(
                    key,
                    event["fence"],
                    event["token"],
                    event["w"],
                    event["takeover"],
                    event["lease_ttl"],
                    event["m0"],
                    event["m1"],
                )
                counts["executions"] += 1
                counts["takeovers"] += event["takeover"]
            else:
                counts[event["outcome"]] += 1
                seen.setdefault(key, []).append(event)
                if event["outcome"] == "conflict" and not event["probe"]:
                    violations.append(f"{key}: same arguments reported as a conflict")
        elif kind in ("extend", "completing", "releasing", "end"):
            run = executions.get(key, {}).get((event["fence"], event["token"]))
            if run is None:
                violations.append(f"{key}: {kind} for fence {event['fence']} never acquired")
                continue
            if kind == "extend":
                counts["extends"] += 1
                if event["lease_expires_at"] is None:
                    counts["extends refused"] += 1
                    run.refused_at.append(event["m0"])
                else:
                    run.extended_at.append(event["m0"])
            elif kind == "completing":
                run.completing = event
            elif kind == "releasing":
                run.releasing_at = event["m0"]
            else:
                run.end = event
                counts[f"end {event['outcome']}"] += 1
        elif kind == "error":
            counts["errors"] += 1
            if event["op"] == "reserve":
                counts["attempts"] += 1
            if event["hang"]:
                counts["hangs"] += 1
                report.untyped_errors.append(f"{key}: {event['op']} hung ({event['error']})")
            elif not event["typed"]:
                report.untyped_errors.append(
                    f"{key}: {event['op']} raised {event['error']}: {event['message']}"
                )
        elif kind == "wait":
            counts["waits"] += 1
    counts["untyped errors"] = len(report.untyped_errors)
    counts["hangs"] += 0
    counts["extends refused"] += 0

    keys = sorted(set(executions) | set(seen) | set(final))
    counts["keys"] = len(keys)
    duplicates = 0
    lost_acknowledgements = 0
    for key in keys:
        runs = sorted(executions.get(key, {}).values(), key=lambda r: r.fence)
        counts["killed in mid-work"] += sum(1 for r in runs if r.end is None)
        counts["re-executions"] += max(0, len(runs) - 1)
        counts["stale owners fenced out"] += sum(1 for r in runs if r.fenced_out())
        # Fences strictly rise in real time: an acquisition whose reserve returned before
        # another's reserve was even sent came first, so its fence must be lower.
        for before, after in itertools.permutations(runs, 2):
            if before.returned_at < after.called_at and after.fence <= before.fence:
                violations.append(f"{key}: fence {after.fence} acquired after fence {before.fence}")
        for before, after in itertools.pairwise(runs):
            # The moment from which ``after`` may rightly acquire: ``before``'s lease lapsed,
            # or its release was sent (then no takeover is needed: the key was free).
            free_from = before.lives_until()
            if before.gave_up():
                assert before.releasing_at is not None or before.end is not None
                sent = before.releasing_at if before.releasing_at is not None else math.inf
                free_from = min(free_from, sent)
            elif not after.takeover:
                duplicates += 1
                violations.append(
                    f"{key}: executed again (fence {after.fence}) without a takeover, while "
                    f"fence {before.fence} never released"
                )
                continue
            if after.returned_at < free_from - CLOCK_TOLERANCE:
                duplicates += 1
                violations.append(
                    f"{key}: executed again (fence {after.fence}, takeover={after.takeover}): "
                    f"its reserve returned {free_from - after.returned_at:.3f} s before fence "
                    f"{before.fence}'s lease could lapse or its release was sent"
                )
        acknowledged = [r for r in runs if r.end is not None and r.end["outcome"] == "completed"]
        counts["acknowledged completions"] += len(acknowledged)
        if len(acknowledged) > 1:
            duplicates += 1
            violations.append(
                f"{key}: {len(acknowledged)} completions acknowledged (fences "
                f"{[r.fence for r in acknowledged]})"
            )
        for done in acknowledged:
            later = [r.fence for r in runs if r.fence > done.fence]
            if later:
                duplicates += 1
                violations.append(
                    f"{key}: fence {done.fence} completed, yet fences {later} were acquired "
                    "(a stale owner completed, or a completed key was executed again)"
                )
        # A reserve sent after ``complete`` returned True must replay that completion.
        lost = False
        for done in acknowledged:
            assert done.end is not None
            acked_at = done.end["m1"]
            shown = [
                (r.fence, r.token, "acquired")
                for r in runs
                if r is not done and r.called_at > acked_at
            ] + [
                (e["fence"], e["token"], e["outcome"])
                for e in seen.get(key, [])
                if not e["probe"] and e["m0"] > acked_at
            ]
            for fence, token, outcome in shown:
                if (fence, token, outcome) != (done.fence, done.token, "replayed"):
                    lost = True
                    violations.append(
                        f"{key}: acknowledged completion (fence {done.fence}) was lost: a "
                        f"reserve sent after it was acknowledged got {outcome} with fence {fence}"
                    )
        record = final.get(key)
        if record is None or record.status is not Status.COMPLETED or record.response is None:
            violations.append(f"{key}: not completed at the end ({record})")
            lost_acknowledgements += lost or bool(acknowledged)
            continue
        stored = executions.get(key, {}).get((record.fence, record.token))
        if stored is None or stored.completing is None:
            violations.append(
                f"{key}: the stored completion (fence {record.fence}) was never attempted"
            )
        else:
            if record.response.hex() != stored.completing["response"]:
                violations.append(
                    f"{key}: stored response differs from what fence {record.fence} completed with"
                )
            outcome = None if stored.end is None else stored.end["outcome"]
            if outcome not in (None, "completed", "unknown"):
                violations.append(
                    f"{key}: fence {record.fence}'s complete said {outcome!r}, yet it is stored"
                )
        if acknowledged and (record.fence, record.token) != (
            acknowledged[0].fence,
            acknowledged[0].token,
        ):
            lost = True
            violations.append(
                f"{key}: acknowledged completion (fence {acknowledged[0].fence}) was lost; "
                f"the store holds fence {record.fence}"
            )
        lost_acknowledgements += lost
        for event in seen.get(key, []):
            if event["status"] != str(Status.COMPLETED):
                continue
            if (event["fence"], event["token"], event["response"]) != (
                record.fence,
                record.token,
                record.response.hex(),
            ):
                violations.append(
                    f"{key}: {event['w']} was shown fence {event['fence']}'s completion, "
                    f"which differs from the stored one (fence {record.fence})"
                )
    counts["duplicates found"] = duplicates
    counts["lost acknowledgements"] = lost_acknowledgements
    _count_pauses(pauses, executions, counts)
    return report


def _count_pauses(
    pauses: list[dict[str, Any]],
    executions: dict[str, dict[tuple[int, str], _Execution]],
    counts: Counter[str],
) -> None:
    """Per pause, the executions it froze past their lease: held when the worker was stopped
    (the reserve had returned, no complete or release sent yet), and resumed after the lease
    could have lapsed. Of those, how many the store then fenced out (an extend, complete or
    release refused) and how many completed anyway (nobody had taken the key over)."""
    by_worker: dict[str, list[_Execution]] = {}
    for runs in executions.values():
        for run in runs.values():
            by_worker.setdefault(run.worker, []).append(run)
    counts["pauses"] += len(pauses)
    counts["paused past their lease"] += 0
    counts["paused owners fenced out"] += 0
    for pause in pauses:
        stopped, resumed = pause["m0"], pause["m1"]
        for run in by_worker.get(pause["victim"], []):
            acted = run.completing["m0"] if run.completing is not None else run.releasing_at
            if run.returned_at >= stopped or (acted is not None and acted <= stopped):
                continue
            if resumed <= run.lives_until(granted_before=stopped):
                continue
            counts["paused past their lease"] += 1
            if run.fenced_out():
                counts["paused owners fenced out"] += 1
            elif run.end is not None and run.end["outcome"] == "completed":
                counts["paused owners completed (no takeover)"] += 1


# -- running workers ------------------------------------------------------------------------


def _executions_open(path: Path, offset: int, open_runs: set[tuple[str, int]]) -> int:
    """Read ``path`` from ``offset``; track executions begun but not ended; new offset."""
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        event = json.loads(line)
        if event["ev"] == "reserve" and event["outcome"] == "acquired" and not event["probe"]:
            open_runs.add((event["key"], event["fence"]))
        elif event["ev"] == "end":
            open_runs.discard((event["key"], event["fence"]))
    return offset + end


@dataclass
class _Process:
    name: str
    log: Path
    popen: subprocess.Popen[bytes]
    offset: int = 0
    open_runs: set[tuple[str, int]] = field(default_factory=set)


class FaultScenario:
    """Something to do to the engine while the workers run (in a thread of its own).

    ``run(stop)`` returns when done (or when ``stop`` is set: the run timed out); whatever it
    found wrong goes in ``problems`` and what it counted in ``counts``.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.counts: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        raise NotImplementedError


def run_history(
    url: str,
    directory: Path,
    *,
    workers: int = 4,
    keys_per_round: int = 30,
    kills: int = 6,
    config: WorkerConfig | None = None,
    seed: int = 0,
    scenario: FaultScenario | None = None,
    final_url: str | None = None,
    timeout: float | None = None,
    until_faults: bool = False,
    pauses: int = 0,
    pause_seconds: tuple[float, float] = (1.5, 3.0),
) -> HistoryReport:
    """Run ``workers`` worker processes on ``url`` and check their history.

    Without a ``scenario`` each worker settles one round of ``keys_per_round`` keys, or, with
    ``until_faults``, goes on round after round until all ``kills`` and ``pauses`` were made
    (a campaign). With a scenario, workers go on round after round until the scenario returns.
    Up to ``kills`` times a worker in mid-work gets SIGKILL and is started again (it begins at
    round 0, replaying what is done). Up to ``pauses`` times a worker in mid-work gets SIGSTOP,
    stays frozen for a time drawn from ``pause_seconds`` (longer than its lease, so others may
    take its keys over) and gets SIGCONT: it wakes up a stale owner and goes on extending,
    completing or releasing, which the store must refuse once the key was taken over. One
    worker at least stays awake to take keys over. Finally a finisher settles every key seen (on
    ``final_url`` when given, say without the fault proxy), the final records are read, and
    the history is checked.
    """
    config = config or WorkerConfig()
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    stop_file = directory / "stop"
    prefix = f"h{seed:x}-{os.getpid()}-{time.monotonic_ns() % 10**9}:"
    if timeout is None:
        # A kill waits for a busy victim and is spaced from the last one (about 0.35 s apart),
        # and each restart costs a process start: scale the bound with the campaign.
        timeout = 150.0 + 2.0 * kills + pause_seconds[1] * pauses
    if scenario is None and not until_faults:
        stop_file.touch()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    generations: Counter[int] = Counter()

    def start(index: int) -> _Process:
        generation = generations[index]
        generations[index] += 1
        name = f"w{index}.{generation}"
        log = directory / f"{name}.jsonl"
        err = (directory / f"{name}.stderr").open("wb")
        argv = [
            sys.executable,
            "-m",
            "tests.reliability.history",
            url,
            str(log),
            name,
            str(rng.randrange(2**32)),
            json.dumps(asdict(config)),
            "--prefix",
            prefix,
            "--keys-per-round",
            str(keys_per_round),
            "--stop-file",
            str(stop_file),
        ]
        try:
            popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=err, stderr=err)
        finally:
            err.close()
        return _Process(name, log, popen)

    started = time.monotonic()
    running = [start(index) for index in range(workers)]
    indexes = {id(p): i for i, p in enumerate(running)}
    stop = threading.Event()
    thread = None
    if scenario is not None:

        def fault_run() -> None:
            try:
                scenario.run(stop)
            except BaseException as exc:  # reported, never lost in a thread
                scenario.problems.append(f"the fault scenario crashed: {exc!r}")
            finally:
                stop_file.touch()

        thread = threading.Thread(target=fault_run, name="fault-scenario", daemon=True)
        thread.start()
    sent = 0
    last_kill = time.monotonic()
    # Frozen workers, each with when it was stopped and when to resume it.
    frozen: list[tuple[_Process, float, float]] = []
    paused = 0
    last_pause = time.monotonic()
    nemesis_log = (directory / "nemesis.jsonl").open("a", encoding="utf-8")
    failures: list[str] = []
    deadline = started + timeout

    def faults_done() -> bool:
        return sent >= kills and paused >= pauses and not frozen

    try:
        while running:
            if time.monotonic() > deadline:
                raise AssertionError(f"workers still running after {timeout}s (see {directory})")
            for process in list(running):
                if process.log.exists():
                    process.offset = _executions_open(
                        process.log, process.offset, process.open_runs
                    )
                code = process.popen.poll()
                if code is None:
                    continue
                running.remove(process)
                if code != 0:
                    stderr = (directory / f"{process.name}.stderr").read_text(errors="replace")
                    failures.append(f"{process.name} exited {code}: {stderr[-1500:]}")
            for entry in list(frozen):
                process, stopped, resume_at = entry
                if time.monotonic() < resume_at:
                    continue
                process.popen.send_signal(signal.SIGCONT)
                # Monotonic, like the workers' stamps: one clock for every process on Linux.
                resumed = time.monotonic()
                frozen.remove(entry)
                line = {"ev": "pause", "victim": process.name, "m0": stopped, "m1": resumed}
                nemesis_log.write(json.dumps(line) + "\n")
                nemesis_log.flush()
                if until_faults and scenario is None and faults_done():
                    stop_file.touch()
            awake = [p for p in running if all(p is not f[0] for f in frozen)]
            busy = [p for p in awake if p.open_runs]
            if (
                paused < pauses
                and busy
                and len(frozen) < workers - 1
                and time.monotonic() - last_pause > 0.25
                and rng.random() < 0.2
            ):
                victim = rng.choice(busy)
                stopped = time.monotonic()
                victim.popen.send_signal(signal.SIGSTOP)
                frozen.append((victim, stopped, stopped + rng.uniform(*pause_seconds)))
                paused += 1
                last_pause = time.monotonic()
                busy.remove(victim)
            if sent < kills and busy and time.monotonic() - last_kill > 0.25 and rng.random() < 0.2:
                victim = rng.choice(busy)
                victim.popen.send_signal(signal.SIGKILL)
                victim.popen.wait()
                sent += 1
                last_kill = time.monotonic()
                running.remove(victim)
                replacement = start(indexes[id(victim)])
                indexes[id(replacement)] = indexes[id(victim)]
                running.append(replacement)
                if until_faults and scenario is None and faults_done():
                    stop_file.touch()
            time.sleep(0.02)
    finally:
        stop.set()
        stop_file.touch()
        nemesis_log.close()
        for process in running:
            process.popen.kill()
            process.popen.wait()
        if thread is not None:
            thread.join(timeout=60)
    if failures:
        raise AssertionError("a worker failed:\n" + "\n".join(failures))

    logs = sorted(directory.glob("w*.jsonl"))
    events = read_events(logs)
    keys = sorted({event["key"] for event in events})
    finisher_log = directory / "finisher.jsonl"
    final = asyncio.run(_finish(final_url or url, keys, finisher_log, rng.randrange(2**32), config))
    report = check_history(read_events([*logs, finisher_log, directory / "nemesis.jsonl"]), final)
    report.run.update(
        {
            "seconds": round(time.monotonic() - started, 1),
            "workers": workers,
            "kills": sent,
            "worker starts": sum(generations.values()),
            "seed": seed,
        }
    )
    if scenario is not None:
        report.run.update(scenario.counts)
        report.violations.extend(scenario.problems)
    return report


async def _finish(
    url: str, keys: list[str], log_path: Path, seed: int, config: WorkerConfig
) -> dict[str, Record | None]:
    from idemstore import open_store

    log = HistoryLog(log_path, "finisher")
    try:
        async with open_store(url) as store:
            worker = Worker(store, log, random.Random(seed), config)
            await worker.settle_all(keys)
            return {key: await store.get(key) for key in keys}
    finally:
        log.close()


async def run_history_in_process(
    store: IdempotencyStore,
    directory: Path,
    *,
    workers: int = 4,
    keys_per_round: int = 30,
    kills: int = 6,
    config: WorkerConfig | None = None,
    seed: int = 0,
    until_faults: bool = False,
) -> HistoryReport:
    """``run_history`` for a store only one process can see (memory): workers are tasks, and a
    kill cancels a task in mid-work (its heartbeat stops, nothing is released). With
    ``until_faults`` the workers go on round after round until all ``kills`` were made."""
    config = config or WorkerConfig()
    rng = random.Random(seed)
    prefix = f"h{seed:x}:"
    logs: list[HistoryLog] = []
    generations: Counter[int] = Counter()

    def start(index: int) -> tuple[asyncio.Task[None], Path, set[tuple[str, int]], list[int]]:
        name = f"w{index}.{generations[index]}"
        generations[index] += 1
        path = directory / f"{name}.jsonl"
        log = HistoryLog(path, name)
        logs.append(log)
        worker = Worker(store, log, random.Random(rng.randrange(2**32)), config)
        task = asyncio.create_task(worker.run_rounds(prefix, keys_per_round, done_killing))
        return task, path, set(), [0]

    sent = 0

    def done_killing() -> bool:
        return not until_faults or sent >= kills

    started = time.monotonic()
    running = {index: start(index) for index in range(workers)}
    last_kill = time.monotonic()
    while running:
        for index, (task, path, open_runs, offset) in list(running.items()):
            offset[0] = _executions_open(path, offset[0], open_runs)
            if task.done():
                task.result()
                del running[index]
        busy = [i for i, (_, _, open_runs, _) in running.items() if open_runs]
        if sent < kills and busy and time.monotonic() - last_kill > 0.25 and rng.random() < 0.2:
            index = rng.choice(busy)
            task = running[index][0]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            sent += 1
            last_kill = time.monotonic()
            running[index] = start(index)
        await asyncio.sleep(0.02)
    for log in logs:
        log.close()
    paths = [directory / f"{log.name}.jsonl" for log in logs]
    keys = sorted({event["key"] for event in read_events(paths)})
    finisher = HistoryLog(directory / "finisher.jsonl", "finisher")
    await Worker(store, finisher, random.Random(rng.randrange(2**32)), config).settle_all(keys)
    finisher.close()
    final = {key: await store.get(key) for key in keys}
    report = check_history(read_events([*paths, directory / "finisher.jsonl"]), final)
    report.run.update(
        {
            "seconds": round(time.monotonic() - started, 1),
            "workers": workers,
            "kills": sent,
            "worker starts": sum(generations.values()),
            "seed": seed,
        }
    )
    return report


# -- one worker process -----------------------------------------------------------------------


async def _worker_main(args: argparse.Namespace) -> None:
    from idemstore import open_store

    config = WorkerConfig(**json.loads(args.config))
    log = HistoryLog(Path(args.log), args.name)
    stop_file = Path(args.stop_file)
    # No ``async with``: it connects at once, and a worker restarted while the engine is down
    # must start anyway and ride the outage out like the others (it connects on first use).
    store = open_store(args.url)
    try:
        worker = Worker(store, log, random.Random(args.seed), config)
        await worker.run_rounds(args.prefix, args.keys_per_round, stop_file.exists)
    finally:
        await store.close()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="one history worker (see module docstring)")
    parser.add_argument("url")
    parser.add_argument("log")
    parser.add_argument("name")
    parser.add_argument("seed", type=int)
    parser.add_argument("config")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys-per-round", type=int, required=True)
    parser.add_argument("--stop-file", required=True)
    asyncio.run(_worker_main(parser.parse_args()))


if __name__ == "__main__":
    main()
