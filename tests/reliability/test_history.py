"""Worker processes killed with SIGKILL in mid-work never make a key run twice while its lease
lives, and every replay is the one stored result (history check, tests/reliability/history.py).
The checker itself is tested first, on histories with each kind of broken promise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pytest

from idemstore import Record, Status, open_store
from tests.reliability.history import (
    WorkerConfig,
    check_history,
    run_history,
    run_history_in_process,
)
from tests.test_process_race import SHARED_STORE_URL_FIXTURES

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.reliability.history import HistoryReport

TTL = 0.5


def assert_history_holds(report: HistoryReport) -> None:
    assert report.violations == [], report.summary()
    assert report.untyped_errors == [], report.summary()
    assert report.counts["duplicates found"] == 0


class History(Protocol):
    def __call__(self, fault: str, **options: Any) -> HistoryReport: ...


@pytest.fixture(params=sorted(SHARED_STORE_URL_FIXTURES))
def history(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    seed: int,
    report_counts: Callable[[dict[str, Any]], None],
) -> History:
    """``run_history`` on a store worker processes share, on each engine in turn, with the
    test's seed; each run's counts are reported under its ``fault``."""
    backend = request.param
    url = request.getfixturevalue(SHARED_STORE_URL_FIXTURES[backend])

    def run(fault: str, **options: Any) -> HistoryReport:
        report = run_history(url, tmp_path, seed=seed, **options)
        report_counts({"backend": backend, "fault": fault, **report.row()})
        return report

    return run


@pytest.mark.slow
def test_sigkilled_workers_never_run_a_key_twice_while_its_lease_lives(
    history: History, kills: int
) -> None:
    report = history("sigkill", workers=4, keys_per_round=30, kills=kills, until_faults=True)
    assert_history_holds(report)
    assert report.run["kills"] == kills
    assert report.counts["executions"] >= report.counts["keys"]


# Pauses: a worker frozen 1.5-3 leases long while it holds keys (SIGSTOP; a GC pause, a
# stopped VM) wakes up a stale owner and goes on extending, completing or releasing. The lease
# is the SIGKILL runs' (TTL), which keeps the run short in the test command.
PAUSED_LEASE = TTL


@pytest.mark.slow
def test_workers_frozen_past_their_lease_are_fenced_out_when_they_wake(
    history: History, pauses: int
) -> None:
    # More long work, most of it heartbeating, some of it outlasting a pause: so a heartbeat
    # wakes up with work left and tries to extend a lease that was taken over.
    config = WorkerConfig(
        lease_ttl=PAUSED_LEASE,
        long_work_probability=0.4,
        long_work_max=4 * PAUSED_LEASE,
        heartbeat_probability=0.7,
    )
    report = history(
        "sigstop",
        workers=4,
        keys_per_round=6,
        kills=0,
        pauses=pauses,
        pause_seconds=(1.5 * PAUSED_LEASE, 3 * PAUSED_LEASE),
        config=config,
        until_faults=True,
    )
    assert_history_holds(report)
    assert report.counts["pauses"] == pauses
    assert report.counts["lost acknowledgements"] == 0
    # Every owner the store refused something was out of its lease; whether a pause lands
    # before a takeover is up to the schedule, so the counts are reported, not asserted.
    assert report.counts["paused owners fenced out"] <= report.counts["paused past their lease"]


async def test_cancelled_worker_tasks_never_run_a_key_twice_on_memory(
    tmp_path: Path, seed: int, kills: int, report_counts: Callable[[dict[str, Any]], None]
) -> None:
    async with open_store("memory://") as store:
        report = await run_history_in_process(
            store, tmp_path, workers=4, keys_per_round=30, kills=kills, seed=seed, until_faults=True
        )
    report_counts({"backend": "memory", "fault": "sigkill", **report.row()})
    assert_history_holds(report)
    assert report.run["kills"] == kills


# -- the checker catches what it must ---------------------------------------------------------


def checker_flags(
    events: list[Any], final: dict[str, Record | None], violation: str
) -> HistoryReport:
    """Check the history, asserting that a violation mentions ``violation``."""
    report = check_history(events, final)
    assert any(violation in v for v in report.violations), report.violations
    return report


def acquired(
    key: str,
    fence: int,
    at: float,
    *,
    takeover: bool = False,
    w: str = "a",
    client_stamp: float | None = None,
) -> Any:
    """A reserve sent and returned at ``at`` (monotonic, as ``m0``/``m1``); the lease's
    deadline as the client computed it from ``client_stamp`` (default ``at``), which a
    checker that ordered by client stamps would read as the acquisition time."""
    stamp = at if client_stamp is None else client_stamp
    return {
        "ev": "reserve",
        "w": w,
        "key": key,
        "m0": at,
        "m1": at,
        "outcome": "acquired",
        "probe": False,
        "fence": fence,
        "token": f"tok{fence}",
        "takeover": takeover,
        "lease_ttl": TTL,
        "lease_expires_at": stamp + TTL,
    }


def extended(
    key: str, fence: int, at: float, expires_at: float | None, *, returned: float | None = None
) -> Any:
    """An extend of ``fence``'s lease by worker a, sent at ``at`` and returned at ``returned``
    (default ``at``), with the new deadline, or None where the store refused it."""
    return {
        "ev": "extend",
        "w": "a",
        "key": key,
        "fence": fence,
        "token": f"tok{fence}",
        "m0": at,
        "m1": at if returned is None else returned,
        "lease_ttl": TTL,
        "lease_expires_at": expires_at,
    }


def completed(
    key: str, fence: int, at: float, response: bytes, outcome: str = "completed", *, w: str = "a"
) -> Any:
    ids = {"w": w, "key": key, "fence": fence, "token": f"tok{fence}"}
    return [
        {"ev": "completing", **ids, "m0": at, "response": response.hex()},
        {"ev": "end", **ids, "m0": at, "m1": at, "outcome": outcome},
    ]


def replayed(key: str, fence: int, response: bytes, *, w: str = "b") -> Any:
    return {
        "ev": "reserve",
        "w": w,
        "key": key,
        "m0": 9.0,
        "m1": 9.0,
        "outcome": "replayed",
        "probe": False,
        "fence": fence,
        "token": f"tok{fence}",
        "status": "completed",
        "response": response.hex(),
    }


def final(key: str, fence: int, response: bytes) -> dict[str, Record | None]:
    record = Record("", key, "fp", Status.COMPLETED, f"tok{fence}", fence, response, 0, 99, None)
    return {key: record}


def test_checker_passes_a_takeover_after_the_lease_lapsed() -> None:
    events = [
        acquired("k", 1, 1.0),  # killed in mid-work: no end
        acquired("k", 2, 1.0 + TTL, takeover=True, w="b"),
        *completed("k", 2, 2.0, b"r"),
        replayed("k", 2, b"r"),
    ]
    report = check_history(events, final("k", 2, b"r"))
    assert report.violations == []
    assert report.counts["killed in mid-work"] == 1
    assert report.counts["re-executions"] == 1


def test_checker_catches_a_second_execution_while_the_lease_lives() -> None:
    events = [
        acquired("k", 1, 1.0),
        acquired("k", 2, 1.2, takeover=True),
        *completed("k", 2, 2, b"r"),
    ]
    report = checker_flags(events, final("k", 2, b"r"), "executed again")
    assert report.counts["duplicates found"] == 1


def test_checker_passes_a_reacquisition_after_a_release_the_killed_owner_had_sent() -> None:
    # The owner sent release and was SIGKILLed before logging its outcome; the release landed,
    # so the next owner took a tombstone (no takeover) while the old lease had time left.
    releasing = {"ev": "releasing", "w": "a", "key": "k", "fence": 1, "token": "tok1", "m0": 1.1}
    events = [
        acquired("k", 1, 1.0),
        releasing,
        acquired("k", 2, 1.2, w="b"),
        *completed("k", 2, 2.0, b"r"),
    ]
    report = check_history(events, final("k", 2, b"r"))
    assert report.violations == []


def test_checker_still_catches_a_reacquisition_when_the_killed_owner_never_released() -> None:
    events = [
        acquired("k", 1, 1.0),  # killed in mid-work, before any release was sent
        acquired("k", 2, 1.2, w="b"),
        *completed("k", 2, 2.0, b"r"),
    ]
    checker_flags(events, final("k", 2, b"r"), "executed again")


def test_checker_catches_a_heartbeat_extended_lease_taken_over() -> None:
    events = [
        acquired("k", 1, 1.0),
        extended("k", 1, 1.3, 1.3 + TTL),
        acquired("k", 2, 1.0 + TTL, takeover=True),
        *completed("k", 2, 2, b"r"),
    ]
    checker_flags(events, final("k", 2, b"r"), "executed again")


def test_checker_catches_a_stale_owner_that_completed() -> None:
    events = [
        acquired("k", 1, 1.0),
        acquired("k", 2, 2.0, takeover=True),
        *completed("k", 1, 2.5, b"stale"),
        *completed("k", 2, 3.0, b"r", outcome="lost"),
    ]
    checker_flags(events, final("k", 1, b"stale"), "stale owner")


def test_checker_catches_two_acknowledged_completions() -> None:
    events = [
        acquired("k", 1, 1.0),
        *completed("k", 1, 1.1, b"one"),
        acquired("k", 2, 5.0, takeover=True),
        *completed("k", 2, 5.1, b"two"),
    ]
    checker_flags(events, final("k", 2, b"two"), "2 completions acknowledged")


def test_checker_catches_a_replay_that_differs_by_one_byte() -> None:
    events = [acquired("k", 1, 1.0), *completed("k", 1, 1.1, b"r\x00"), replayed("k", 1, b"r\x01")]
    checker_flags(events, final("k", 1, b"r\x00"), "differs from the stored one")


def test_checker_catches_a_lost_acknowledged_completion() -> None:
    # The store forgot fence 1's completion (say, a crash), so the key ran again from fence 1.
    events = [
        acquired("k", 1, 1.0),
        *completed("k", 1, 1.1, b"first"),
        acquired("k", 1, 3.0, w="b") | {"token": "other"},
    ]
    events.append({**events[-1], "ev": "completing", "response": b"second".hex()})
    events.append({**events[-2], "ev": "end", "outcome": "completed"})
    record = Record("", "k", "fp", Status.COMPLETED, "other", 1, b"second", 0, 99, None)
    report = check_history(events, {"k": record})
    assert any("fence 1 acquired after fence 1" in v for v in report.violations)
    assert any("acknowledged completion (fence 1) was lost" in v for v in report.violations)


def test_checker_catches_a_refused_complete_that_was_stored() -> None:
    events = [acquired("k", 1, 1.0), *completed("k", 1, 1.1, b"r", outcome="lost")]
    checker_flags(events, final("k", 1, b"r"), "complete said 'lost'")


def test_checker_catches_other_arguments_acquiring_a_key() -> None:
    probe = acquired("k", 2, 3.0) | {"probe": True}
    events = [acquired("k", 1, 1.0), *completed("k", 1, 1.1, b"r"), probe]
    checker_flags(events, final("k", 1, b"r"), "other arguments acquired")


def test_checker_catches_a_key_left_unfinished() -> None:
    checker_flags([acquired("k", 1, 1.0)], {"k": None}, "not completed at the end")


def _released(key: str, fence: int, at: float, *, w: str = "a") -> Any:
    ids = {"w": w, "key": key, "fence": fence, "token": f"tok{fence}"}
    return [
        {"ev": "releasing", **ids, "m0": at},
        {"ev": "end", **ids, "m0": at, "m1": at, "outcome": "released"},
    ]


def test_checker_stays_silent_on_a_delayed_retry_whose_client_stamp_is_older() -> None:
    # Worker b computed its lease stamp at 1.0 and its reserve was retried by the SDK until 1.5;
    # a's reserve (sent at 1.1) got fence 1 first and released. The stamps say fence 2 came
    # first, but the two reserve calls overlapped in real time: no order can be read from them.
    early_b = acquired("k", 2, 1.0, w="b") | {"m0": 1.0, "m1": 1.5}
    events = [
        acquired("k", 1, 1.1) | {"m0": 1.1, "m1": 1.2},
        *_released("k", 1, 1.3),
        early_b,
        *completed("k", 2, 2.0, b"r"),
    ]
    report = check_history(events, final("k", 2, b"r"))
    assert not any("acquired after" in v for v in report.violations), report.violations


def test_checker_reports_a_real_fence_inversion() -> None:
    # Fence 2's reserve returned before fence 1's was sent: in real time 2 came first. Fence
    # 1's client stamp is older (b's wall clock was stepped back between the two calls), so a
    # checker that ordered by client stamps would see fence 1 first and miss the inversion.
    events = [
        acquired("k", 2, 1.0) | {"m0": 1.0, "m1": 1.1},
        *_released("k", 2, 1.2),
        acquired("k", 1, 2.0, w="b", client_stamp=0.8) | {"m0": 2.0, "m1": 2.1},
        *completed("k", 1, 2.5, b"r", w="b"),
    ]
    checker_flags(events, final("k", 1, b"r"), "fence 1 acquired after fence 2")


def test_checker_catches_a_takeover_that_returned_before_the_lease_could_lapse() -> None:
    # Fence 1's reserve was sent at 1.0 with a 0.5 s lease; fence 2's takeover returned at
    # 1.3, so the engine handed it out while fence 1's lease lived, whatever b's client stamp
    # (a clock running ahead) says.
    events = [
        acquired("k", 1, 1.0),
        acquired("k", 2, 1.2, takeover=True, w="b", client_stamp=1.6) | {"m1": 1.3},
        *completed("k", 2, 2.0, b"r", w="b"),
    ]
    report = checker_flags(events, final("k", 2, b"r"), "executed again")
    assert report.counts["duplicates found"] == 1


def test_checker_stays_silent_on_a_takeover_retried_past_the_lapse_with_an_older_stamp() -> None:
    # b's takeover computed its stamp at 1.2 (before fence 1's lease could lapse at 1.5) and
    # was retried by the SDK until 1.6: the engine may have acted after the lapse, so no
    # duplicate can be claimed.
    events = [
        acquired("k", 1, 1.0),
        acquired("k", 2, 1.2, takeover=True, w="b") | {"m1": 1.6},
        *completed("k", 2, 2.0, b"r", w="b"),
    ]
    report = check_history(events, final("k", 2, b"r"))
    assert report.violations == []


def in_progress(key: str, fence: int, token: str, sent: float) -> Any:
    return {
        "ev": "reserve",
        "w": "b",
        "key": key,
        "m0": sent,
        "m1": sent + 0.05,
        "outcome": "in-progress",
        "probe": False,
        "fence": fence,
        "token": token,
        "status": "in_progress",
        "response": None,
    }


def test_checker_catches_a_reserve_sent_after_the_acknowledgement_that_missed_it() -> None:
    # complete returned True at 1.1; a reserve sent at 1.3 was shown the key in progress
    # under another owner: the acknowledged completion was gone then.
    events = [acquired("k", 1, 1.0), *completed("k", 1, 1.1, b"r"), in_progress("k", 1, "x", 1.3)]
    report = checker_flags(events, final("k", 1, b"r"), "a reserve sent after it was acknowl")
    assert report.counts["lost acknowledgements"] == 1


def test_checker_stays_silent_on_a_reserve_that_overlapped_the_complete() -> None:
    # The reserve was sent at 1.05, before complete returned at 1.1: it may have been served
    # before the completion, and showing the key in progress is right.
    events = [
        acquired("k", 1, 1.0),
        *completed("k", 1, 1.1, b"r"),
        in_progress("k", 1, "tok1", 1.05),
        replayed("k", 1, b"r"),
    ]
    report = check_history(events, final("k", 1, b"r"))
    assert report.violations == []
    assert report.counts["lost acknowledgements"] == 0


def pause(victim: str, stopped: float, resumed: float) -> Any:
    return {"ev": "pause", "victim": victim, "m0": stopped, "m1": resumed}


def test_checker_counts_a_paused_owner_fenced_out_after_a_takeover() -> None:
    events = [
        acquired("k", 1, 1.0),
        pause("a", 1.1, 2.9),  # frozen past its 0.5 s lease
        acquired("k", 2, 1.8, takeover=True, w="b"),
        *completed("k", 2, 2.0, b"r", w="b"),
        extended("k", 1, 3.0, None, returned=3.01),  # refused: the key was taken over
        *completed("k", 1, 3.1, b"stale", outcome="lost"),
        acquired("j", 1, 5.0),  # acquired after the pause: not frozen by it
        *completed("j", 1, 5.1, b"r"),
    ]
    report = check_history(events, final("k", 2, b"r") | final("j", 1, b"r"))
    assert report.violations == []
    assert report.counts["pauses"] == 1
    assert report.counts["paused past their lease"] == 1
    assert report.counts["paused owners fenced out"] == 1
    assert report.counts["stale owners fenced out"] == 1
    assert report.counts["extends refused"] == 1


def test_checker_catches_a_paused_owner_whose_stale_complete_was_accepted() -> None:
    events = [
        acquired("k", 1, 1.0),
        pause("a", 1.1, 2.9),
        acquired("k", 2, 1.8, takeover=True, w="b"),
        *completed("k", 1, 3.0, b"stale"),
        *completed("k", 2, 3.2, b"r", outcome="lost", w="b"),
    ]
    checker_flags(events, final("k", 1, b"stale"), "stale owner")
