"""The ``peers`` bench scenario: idemstore beside idemkit and Powertools on the same servers.

The peer packages are in the ``test`` extra, so these run (never skip) wherever the suite does.
Benchmarks are not tests: nothing here asserts a timing, only that every row has its counts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from idemstore.bench.peers_scenario import (
    FIRST,
    PEERS,
    REPLAY,
    SCENARIO,
    Peer,
    default_scenarios,
    installed_peers,
    peer_note,
    run_peers,
)
from idemstore.bench.report import note_lines
from idemstore.bench.results import BenchResult, Measurement, Unavailable
from idemstore.bench.runner import Target
from idemstore.bench.scenarios import ON_REQUEST, SCENARIOS, Load

if TYPE_CHECKING:
    import pytest

    from idemstore.bench.peers_timing import Side

# 2 keys per round over 4 rounds: 8 first calls and 8 replays per side.
LOAD = Load(concurrency=1, ops=16, duration=None, payload_bytes=256)


def assert_counted(m: Measurement) -> None:
    """idemstore (subject) and the peer (floor) both timed every call, without errors, and
    ran the work once per key on first calls and never on replays."""
    assert m.floor is not None
    for timing in (m.subject, m.floor):
        assert timing.errors == {}, timing.error_examples
        assert len(timing.latencies_ns) == timing.ops > 0
    if m.scenario == FIRST:
        assert m.subject.executions == m.subject.unique_keys == m.expected_executions > 0
        assert m.floor.executions == m.floor.unique_keys > 0
    else:
        assert m.subject.executions == m.floor.executions == m.expected_executions == 0
    assert m.notes["peer_executions"] == m.notes["peer_expected_executions"]


async def test_idemstore_and_each_peer_are_timed_on_the_same_redis_and_postgres(
    redis_store_url: str, postgres_store_url: str
) -> None:
    targets = [Target("redis", redis_store_url), Target("postgres", postgres_store_url)]
    measured = await run_peers(targets, LOAD, "test-")
    rows = [m for m in measured if isinstance(m, Measurement)]
    assert {(m.backend, m.scenario) for m in rows} == {
        (f"{engine} vs {peer}", scenario)
        for engine, peer in (
            ("redis", "idemkit"),
            ("redis", "powertools"),
            ("postgres", "idemkit"),
        )
        for scenario in (FIRST, REPLAY)
    }
    for m in rows:
        assert_counted(m)
    # Same door on both sides: idemkit against the async runner, Powertools against the sync.
    assert {m.notes["peer"]: m.notes["door"] for m in rows} == {
        "idemkit": "async",
        "powertools": "sync",
    }
    (missing,) = [u for u in measured if isinstance(u, Unavailable)]
    assert missing.backend == "postgres vs powertools" and "PostgreSQL" in missing.reason
    assert len(note_lines(BenchResult(measurements=rows))) == len(rows)


async def test_every_concurrency_level_has_its_rows_with_that_many_callers_per_side(
    redis_store_url: str,
) -> None:
    # Two levels on the same open sides; at 4 callers a round gives each caller its own keys.
    load = Load(concurrency=1, ops=32, duration=None, payload_bytes=256)
    # A prefix of its own: the other tests' keys on the shared server must not be replays here.
    target = [Target("redis", redis_store_url)]
    measured = await run_peers(target, load, "test-levels-", levels=(1, 4))
    rows = [m for m in measured if isinstance(m, Measurement)]
    assert sorted({(m.concurrency, m.notes["peer"], m.scenario) for m in rows}) == sorted(
        (level, peer, scenario)
        for level in (1, 4)
        for peer in ("idemkit", "powertools")
        for scenario in (FIRST, REPLAY)
    )
    assert len(rows) == 8
    for m in rows:
        assert_counted(m)
        if m.concurrency == 4 and m.scenario == FIRST:
            # Every caller made first calls of its own: at least one key each.
            assert m.subject.unique_keys >= 4 and m.floor.unique_keys >= 4


async def test_a_peer_that_runs_the_work_twice_shows_at_concurrency(
    redis_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A peer that forgets every key between its first call and the replay runs the work again
    # on each replay: the scenario must count those executions, threads or tasks alike.
    from idemstore.bench import peers_scenario

    opened = peers_scenario._open_peer

    async def forgetful(peer: Peer, engine: str, url: str) -> Side:
        side = await opened(peer, engine, url)
        calls = side.call
        seen: set[str] = set()

        def call(key: str) -> object:
            if key in seen:
                return calls(f"{key}-again")
            seen.add(key)
            return calls(key)

        side.call = call
        return side

    monkeypatch.setattr(peers_scenario, "_open_peer", forgetful)
    load = Load(concurrency=4, ops=16, duration=None, payload_bytes=256)
    measured = await run_peers([Target("redis", redis_store_url)], load, "test-forgetful-")
    replays = [m for m in measured if isinstance(m, Measurement) and m.scenario == REPLAY]
    assert {m.notes["peer"] for m in replays} == {"idemkit", "powertools"}
    for m in replays:
        assert m.concurrency == 4
        assert m.floor is not None and m.floor.executions == m.floor.ops > 0
        assert m.notes["peer_executions"] != m.notes["peer_expected_executions"]
        assert "ran the work" in (peer_note(m) or "")


async def test_powertools_is_timed_beside_the_sync_runner_on_dynamodb(
    dynamodb_store_url: str,
) -> None:
    measured = await run_peers([Target("dynamodb", dynamodb_store_url)], LOAD, "test-")
    rows = [m for m in measured if isinstance(m, Measurement)]
    assert {(m.backend, m.scenario) for m in rows} == {
        ("dynamodb vs powertools", FIRST),
        ("dynamodb vs powertools", REPLAY),
    }
    for m in rows:
        assert_counted(m)


async def test_a_missing_peer_package_is_skipped_with_its_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry in sys.modules is how Python marks a module that cannot be imported.
    for peer in PEERS:
        monkeypatch.setitem(sys.modules, peer.module, None)
    assert installed_peers() == []
    measured = await run_peers([Target("redis", "redis://127.0.0.1:1/0")], LOAD, "test-")
    assert all(isinstance(u, Unavailable) for u in measured)
    reasons = {u.backend: u.reason for u in measured if isinstance(u, Unavailable)}
    assert reasons == {
        peer.name: f"{peer.distribution} is not installed: pip install {peer.distribution}"
        for peer in PEERS
    }


def test_peers_joins_the_default_scenarios_only_when_a_peer_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_request = set(ON_REQUEST)
    assert SCENARIO in default_scenarios(SCENARIOS)
    assert default_scenarios(SCENARIOS) == tuple(s for s in SCENARIOS if s not in on_request)
    for peer in PEERS:
        monkeypatch.setitem(sys.modules, peer.module, None)
    assert default_scenarios(SCENARIOS) == tuple(
        s for s in SCENARIOS if s != SCENARIO and s not in on_request
    )


async def test_a_run_without_a_peer_engine_says_which_targets_it_needs() -> None:
    measured = await run_peers([Target("memory", "memory://")], LOAD, "test-")
    assert [u.reason for u in measured if isinstance(u, Unavailable)] == [
        "no Redis, PostgreSQL or DynamoDB target: give their URLs, or use --local"
    ]


async def test_a_server_that_refuses_connections_is_reported_and_the_run_goes_on(
    redis_store_url: str,
) -> None:
    # Port 1 on loopback: nothing listens there, so every connection is refused at once.
    refused = Target("postgres", "postgresql://bench@127.0.0.1:1/bench")
    measured = await run_peers([refused, Target("redis", redis_store_url)], LOAD, "test-")
    failed = [u for u in measured if isinstance(u, Unavailable) and u.backend == "postgres"]
    assert failed and "door failed" in failed[0].reason
    assert {m.backend for m in measured if isinstance(m, Measurement)} == {
        "redis vs idemkit",
        "redis vs powertools",
    }
