"""``idemstore bench``: it runs end to end, reports what it must, and survives what is missing.

Benchmarks are not tests: nothing here asserts a timing, only that numbers are there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import cli
from idemstore.backends.registry import engines
from idemstore.backends.urls import open_store
from idemstore.bench import SCENARIOS, BenchConfig, Target, run_bench
from idemstore.bench.floors import FLOOR_TABLE, floor_for_url
from idemstore.bench.hasher_scenario import SHAPES, run_hasher
from idemstore.bench.local import Launcher, start_local_servers, stop_local_servers
from idemstore.bench.probes import WAKE_TIMEOUT, run_middleware
from idemstore.bench.report import COLUMNS, note_lines, print_table, to_markdown
from idemstore.bench.results import BenchResult, Measurement, Timing, Unavailable, percentile
from idemstore.bench.runner import (
    DEFAULT_CONCURRENCY,
    DEFAULT_OPS,
    DEFAULT_PAYLOAD_BYTES,
    cpu_idle,
)
from idemstore.bench.scenarios import (
    IDENTICAL_CALLS,
    PROXY_MODULE,
    Load,
    measure_stdio,
    mock_server_argv,
    relay_argv,
    run_proxy,
)
from idemstore.errors import ConfigurationError
from idemstore.hashing import COMPILED
from idemstore.protocol import Record
from tests.conftest import make_venv
from tests.contract.test_contract_kit import run_python

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULT_FIELDS = {
    "backend",
    "url",
    "scenario",
    "concurrency",
    "ops",
    "seconds",
    "ops_per_s",
    "latency_ms",
    "errors",
    "executions",
    "unique_keys",
    "expected_executions",
    "exactly_once",
    "outcomes",
    "floor",
    "ratio_p50",
    "ratio_throughput",
}


def sqlite_backend_present() -> bool:
    """Whether this version has the sqlite:// backend (the bench reports it otherwise)."""
    try:
        open_store("sqlite:///:memory:")
    except ConfigurationError as exc:
        if "not part of this version" in str(exc):
            return False
        raise
    return True


# Every engine the registry says runs in-process: id -> its embedded URL template.
EMBEDDED = {engine.name: engine.embedded for engine in engines() if engine.embedded}


@pytest.fixture(params=sorted(EMBEDDED))
def embedded_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return EMBEDDED[request.param].replace("{dir}", str(tmp_path))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    args = ("-m", "idemstore", "bench", *args)
    return run_python(sys.executable, *args, cwd=cwd, pythonpath=str(ROOT), timeout=240)


# -- end to end ------------------------------------------------------------------------------


def test_embedded_run_writes_json_markdown_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_cli(
        "--ops", "24", "--concurrency", "1,4", "--scenario", "fresh", "replay", "contention",
        "mixed", "hasher", "--payload-bytes", "64", "--out", str(out), "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    written = json.loads((out / "results.json").read_text())
    assert printed["config"] == written["config"]
    assert written["config"]["ops"] == 24 and written["config"]["concurrency"] == [1, 4]
    assert {"idemstore", "python", "machine", "cpus", "cpu_idle", "versions"} <= set(
        written["meta"]
    )

    stores = {"memory", "sqlite"} if sqlite_backend_present() else {"memory"}
    results = written["results"]
    for result in results:
        assert set(result) >= RESULT_FIELDS, result["backend"]
        assert set(result["latency_ms"]) >= {"p50", "p90", "p99", "p99.9"}
    measured = {(r["backend"], r["scenario"], r["concurrency"]) for r in results}
    for store in stores:
        for scenario in ("fresh", "replay", "contention", "mixed"):
            for level in (1, 4):
                assert (store, scenario, level) in measured
    for result in results:
        if result["backend"] in stores:
            assert result["ops"] == 24 and result["errors"] == {}
            assert result["floor"]["name"] and result["floor"]["latency_ms"]["p50"] is not None
            assert result["ratio_p50"] is not None and result["ratio_throughput"] is not None
            assert result["exactly_once"] is True
    if "sqlite" not in stores:
        assert any(u["backend"] == "sqlite" for u in written["unavailable"])
    assert {"fingerprint mixed", "rfc8785 float", "sorted json unicode"} <= {
        r["backend"] for r in results if r["scenario"] == "hasher"
    }

    markdown = (out / "results.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in markdown
    for chart in ("latency.png", "throughput.png"):
        assert (out / chart).read_bytes().startswith(PNG_SIGNATURE)
        assert f"]({chart})" in markdown


def test_the_table_goes_to_stdout_and_names_each_backend(tmp_path: Path) -> None:
    done = run_cli("memory://", "--ops", "8", "--concurrency", "2", "--scenario", "fresh",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "memory" in done.stdout and "fresh" in done.stdout
    assert "p50/fl" in done.stdout


def test_the_intro_and_notes_wrap_at_80_columns_and_say_where_the_charts_are(
    tmp_path: Path,
) -> None:
    # the default run's intro (an --ops run: no estimate) is the longest line it writes
    done = run_cli("memory://", "--ops", "8", "--concurrency", "1", "--scenario", "fresh",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stderr.splitlines()) <= 80, done.stderr
    said = " ".join(done.stderr.split())
    assert "the time depends on the backends" in said
    assert "no charts or results.md written: add --out DIR" in said


def test_the_default_table_fits_80_columns_and_wide_shows_every_column(tmp_path: Path) -> None:
    args = ("memory://", "--ops", "16", "--concurrency", "1,16", "--scenario", "fresh", "wake",
            "middleware")  # fmt: skip
    narrow = run_cli(*args, cwd=tmp_path)
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("once" in line and "fl/ops" in line for line in lines)
    assert any("asgi new key" in line for line in lines)
    wide = run_cli(*args, "--wide", cwd=tmp_path)
    assert wide.returncode == 0, wide.stderr
    header = next(line for line in wide.stdout.splitlines() if "x floor ops/s" in line)
    assert header.split() == " ".join(COLUMNS).split()


def test_a_backend_that_cannot_be_opened_is_reported_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = cli.main(
        ["bench", "memory://", "memory://?no_such_option=1", "nosuch://x",
         "--ops", "8", "--concurrency", "2", "--scenario", "fresh", "--json"]
    )  # fmt: skip
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in report["results"]] == ["memory"]
    reasons = {u["backend"]: u["reason"] for u in report["unavailable"]}
    assert "no_such_option" in reasons["memory-2"]
    assert "unknown store scheme" in reasons["nosuch"]


def test_no_backend_at_all_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "nosuch://x", "--ops", "4", "--scenario", "fresh"]) == 2
    assert "no backend could be measured" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_runs_without_the_bench_extra(built_wheel: Path, tmp_path: Path) -> None:
    """No rich, no matplotlib: a plain table, plain progress, JSON and Markdown but no charts."""
    bin_dir = make_venv(tmp_path / "venv", str(built_wheel))
    out = tmp_path / "out"
    done = subprocess.run(
        [str(bin_dir / "idemstore"), "bench", "memory://", "--ops", "8", "--concurrency", "2",
         "--scenario", "fresh", "hasher", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "p50/fl" in done.stdout and "fingerprint" in done.stdout
    assert "[1/" not in done.stderr  # no progress where stderr is not a terminal
    assert "pip install '.[bench]' (in idemstore's checkout)" in done.stderr
    assert entries(out) == ["results.json", "results.md"]


def test_cli_defaults_match_the_bench_package() -> None:
    assert cli.SCENARIO_NAMES == SCENARIOS
    assert cli.DEFAULT_CONCURRENCY == DEFAULT_CONCURRENCY
    assert cli.DEFAULT_OPS == DEFAULT_OPS
    assert cli.DEFAULT_PAYLOAD_BYTES == DEFAULT_PAYLOAD_BYTES


# -- scenarios -------------------------------------------------------------------------------


async def bench_one(name: str, url: str, **config: Any) -> BenchResult:
    """``run_bench`` on the one target ``name`` at ``url``, with a ``BenchConfig`` of
    ``config``; the target must not be reported unavailable."""
    result = await run_bench([Target(name, url)], BenchConfig(**config))
    assert result.unavailable == [], result.unavailable
    return result


async def test_contention_executes_each_key_exactly_once(embedded_url: str) -> None:
    result = await bench_one(
        "store", embedded_url, scenarios=("contention",), concurrency=(16,), ops=160
    )
    (measured,) = result.measurements
    assert measured.subject.errors == {}
    assert measured.subject.unique_keys >= 1
    assert measured.subject.executions == measured.subject.unique_keys
    assert measured.exactly_once is True
    # The other workers lost the race: they saw the key in progress or already completed.
    losers = measured.subject.outcomes.get("in_progress", 0)
    losers += measured.subject.outcomes.get("completed", 0)
    assert losers == 160 - measured.subject.executions


async def test_replay_executes_nothing_and_finds_every_key_completed(embedded_url: str) -> None:
    result = await bench_one("store", embedded_url, scenarios=("replay",), concurrency=(4,), ops=40)
    (measured,) = result.measurements
    assert measured.subject.executions == 0 and measured.expected_executions == 0
    assert measured.subject.outcomes == {"completed": 40}
    assert measured.floor is not None and measured.floor.outcomes == {"present": 40}


async def test_mixed_retries_some_keys_and_runs_each_new_key_once() -> None:
    result = await bench_one("memory", "memory://", scenarios=("mixed",), concurrency=(2,), ops=200)
    (measured,) = result.measurements
    outcomes = measured.subject.outcomes
    assert outcomes["acquired"] == measured.subject.unique_keys == measured.subject.executions
    assert outcomes["completed"] == 200 - outcomes["acquired"] > 0


async def test_duration_mode_runs_until_the_deadline() -> None:
    result = await bench_one(
        "memory", "memory://", scenarios=("fresh",), concurrency=(2,), ops=None, duration=0.05
    )
    (measured,) = result.measurements
    assert measured.subject.ops > 0 and measured.exactly_once is True
    assert result.config["duration"] == 0.05 and result.config["ops"] is None


def test_hasher_compares_fingerprint_rfc8785_and_sorted_json_on_every_shape() -> None:
    measured = run_hasher(Load(concurrency=1, ops=10, duration=None, payload_bytes=512))
    by_name = {m.backend: m for m in measured}
    hashers = ("fingerprint", "rfc8785", "sorted json")
    assert set(by_name) == {f"{h} {shape}" for h in hashers for shape in SHAPES}
    for m in measured:
        assert m.scenario == "hasher" and len(m.subject.latencies_ns) == 10
        assert m.notes["value_bytes"] >= 512
        assert m.notes["fingerprint_pass"] == ("compiled" if COMPILED else "pure Python")
    for shape in SHAPES:
        ours = by_name[f"fingerprint {shape}"]
        assert ours.notes["agrees_with_rfc8785"] is True
        assert ours.notes["rfc8785_x_p50"] > 0 and ours.notes["rfc8785_x_ops"] > 0
        assert by_name[f"rfc8785 {shape}"].notes["rfc8785_x_p50"] == 1.0
        assert by_name[f"sorted json {shape}"].ratio_p50 == 1.0


async def test_the_mock_server_called_directly_runs_every_identical_call() -> None:
    timing = await measure_stdio(mock_server_argv, Load(1, 3, None, 16))
    assert len(timing.latencies_ns) == 3 and timing.errors == {}
    assert timing.executions == IDENTICAL_CALLS and timing.unique_keys == 1


async def test_proxy_scenario_is_measured_or_reported_unavailable() -> None:
    outcome = await run_proxy(Load(1, 5, None, 16))
    if importlib.util.find_spec(PROXY_MODULE) is None:
        assert isinstance(outcome, Unavailable) and outcome.scenario == "proxy"
        assert PROXY_MODULE in outcome.reason
        return
    assert isinstance(outcome, Measurement)
    assert outcome.notes["direct_executions"] == IDENTICAL_CALLS
    assert outcome.subject.executions == 1 and outcome.exactly_once is True
    assert {"added_p50_ms", "relay_added_p50_ms"} <= set(outcome.notes)


async def test_the_bare_relay_passes_every_call_through_to_the_server() -> None:
    """The proxy's floor relays and nothing else: identical calls all execute."""
    timing = await measure_stdio(lambda c: relay_argv(mock_server_argv(c)), Load(1, 3, None, 16))
    assert len(timing.latencies_ns) == 3 and timing.errors == {}
    assert timing.executions == IDENTICAL_CALLS


# -- probes ----------------------------------------------------------------------------------


async def test_wake_times_a_wait_woken_by_complete_on_every_embedded_backend(
    embedded_url: str,
) -> None:
    result = await bench_one("store", embedded_url, scenarios=("wake",), ops=5)
    (measured,) = result.measurements
    assert measured.scenario == "wake" and measured.subject.errors == {}
    assert len(measured.subject.latencies_ns) == 5
    # Woken by the complete, not by the timeout: well under WAKE_TIMEOUT each.
    assert max(measured.subject.latencies_ns) < WAKE_TIMEOUT * 1e9 / 2


async def test_commands_and_replay_writes_are_skipped_where_the_engine_has_no_counters() -> None:
    result = await bench_one("memory", "memory://", scenarios=("commands", "replay-writes"), ops=5)
    assert result.measurements == []


async def test_commands_counts_redis_commands_per_reserve_and_complete(
    redis_store_url: str,
) -> None:
    result = await bench_one("redis", redis_store_url, scenarios=("commands",), ops=20)
    by_case = {m.notes["case"]: m for m in result.measurements}
    fresh, replay = by_case["fresh"].notes, by_case["replay"].notes
    # A fresh key: a reserve script and a complete script; a replay: the reserve script only.
    assert fresh["commands_per_op"]["evalsha"] == 2
    assert replay["commands_per_op"]["evalsha"] == 1
    assert by_case["fresh"].exactly_once is True and by_case["replay"].subject.executions == 0
    assert "commands per op" in "\n".join(note_lines(result))


async def test_replay_writes_show_that_postgres_replays_write_nothing(
    quiet_postgres_store_url: str,
) -> None:
    url = quiet_postgres_store_url  # the WAL position is server-wide: a server of its own
    result = await bench_one("postgres", url, scenarios=("replay-writes",), ops=30)
    (measured,) = result.measurements
    notes = measured.notes
    assert notes["replays"] == 30 and measured.subject.executions == 0
    assert notes["row_rewritten"] is False
    # The server may log a running-transactions record (about 50 bytes) meanwhile; rewriting
    # the row 30 times would log several kilobytes.
    assert notes["wal_bytes"] < 1000
    assert "30 replays did not rewrite the row" in "\n".join(note_lines(result))


async def test_postgres_write_counters_see_a_rewrite_of_the_row(postgres_store_url: str) -> None:
    """The probe above cannot pass by reading counters that never move."""
    floor = floor_for_url(postgres_store_url)
    assert floor is not None and hasattr(floor, "write_counters")
    await floor.open()
    try:
        async with open_store(postgres_store_url) as store:
            reserved = await store.reserve("k", "fp", scope="s", lease_ttl=30, retention=60)
            assert reserved.lease is not None
            before = await floor.write_counters("s", "k")
            assert await store.complete(reserved.lease, b"done")
            after = await floor.write_counters("s", "k")
    finally:
        await floor.close()
    assert after["row_version"] != before["row_version"]
    assert after["wal_bytes"] > before["wal_bytes"]


async def test_the_postgres_floor_pools_as_many_connections_as_the_store(
    postgres_store_url: str,
) -> None:
    joiner = "&" if "?" in postgres_store_url else "?"
    url = f"{postgres_store_url}{joiner}pool_max_size=3"
    floor = floor_for_url(url)
    assert floor is not None
    await floor.open()
    try:
        async with open_store(url) as store:
            await store.ping()
            floor_pool = floor._pool  # type: ignore[attr-defined]
            assert floor_pool.get_max_size() == 3
            assert store._connection.get_max_size() == 3  # type: ignore[attr-defined]
    finally:
        await floor.close()


async def test_the_postgres_floor_pool_sends_no_reset_query_on_release(
    postgres_store_url: str,
) -> None:
    """The store's pool skips asyncpg's per-release reset (a round trip); the floor's must too,
    or the floor pays a cost the store does not and stops bounding it."""
    joiner = "&" if "?" in postgres_store_url else "?"
    floor = floor_for_url(f"{postgres_store_url}{joiner}pool_max_size=1")
    assert floor is not None
    await floor.open()
    try:
        pool = floor._pool  # type: ignore[attr-defined]
        async with pool.acquire() as connection:
            await connection.execute("SET idemstore_bench.probe = 'kept'")
        # A reset (RESET ALL) on release would have cleared the setting.
        async with pool.acquire() as connection:
            kept = await connection.fetchval("SELECT current_setting('idemstore_bench.probe')")
    finally:
        await floor.close()
    assert kept == "kept"


async def test_the_postgres_floor_table_has_the_columns_of_a_record(
    postgres_store_url: str,
) -> None:
    floor = floor_for_url(postgres_store_url)
    assert floor is not None
    await floor.open()
    try:
        assert await floor.put("k", b"v") is True
        await floor.finish("k", b"w")
        pool = floor._pool  # type: ignore[attr-defined]
        table = f"{FLOOR_TABLE}_{floor._run}"  # type: ignore[attr-defined]
        row = await pool.fetchrow(f"SELECT * FROM {table}")
    finally:
        await floor.close()
    assert set(row.keys()) == {field.name for field in dataclasses.fields(Record)}
    assert (row["status"], row["response"], row["fence"]) == ("completed", b"w", 1)


async def test_middleware_is_measured_per_case_against_the_bare_app() -> None:
    measured = await run_middleware(Load(1, 10, None, 16), "t:")
    assert not isinstance(measured, Unavailable)
    assert [m.backend for m in measured] == [
        "asgi no key",
        "asgi new key",
        "asgi replay",
        "asgi streamed 1 MB",
        "asgi follower first byte",
    ]
    for m in measured:
        assert m.scenario == "middleware" and m.subject.errors == {}
        assert len(m.subject.latencies_ns) == 10 and m.floor is not None
        assert len(m.floor.latencies_ns) == 10 and m.ratio_p50 is not None


# -- floors ----------------------------------------------------------------------------------


async def test_memory_floor_inserts_each_key_once() -> None:
    floor = floor_for_url("memory://")
    assert floor is not None
    await floor.open()
    assert await floor.put("k", b"v") is True
    assert await floor.put("k", b"v") is False
    await floor.reset()
    assert await floor.put("k", b"v") is True
    await floor.close()


def test_sqlite_floor_takes_synchronous_from_the_url(tmp_path: Path) -> None:
    default = floor_for_url(f"sqlite:///{tmp_path}/store.db")
    normal = floor_for_url(f"sqlite:///{tmp_path}/store.db?synchronous=normal")
    assert default is not None and "synchronous=FULL" in default.name
    assert normal is not None and "synchronous=NORMAL" in normal.name
    with pytest.raises(ConfigurationError):
        floor_for_url(f"sqlite:///{tmp_path}/store.db?synchronous=sometimes")


async def test_sqlite_floor_inserts_once_under_races_and_leaves_nothing(tmp_path: Path) -> None:
    floor = floor_for_url(f"sqlite:///{tmp_path}/store.db")
    assert floor is not None
    await floor.open()
    try:
        # Its own file beside the store's, never the store's own.
        (floor_dir,) = entries(tmp_path)
        assert floor_dir.startswith("idemstore-bench-floor-")
        inserted = await asyncio.gather(*(floor.put("same", b"v") for _ in range(16)))
        assert inserted.count(True) == 1
        await floor.reset()
        assert await floor.put("same", b"v") is True
    finally:
        await floor.close()
    assert entries(tmp_path) == []


def entries(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_a_scheme_without_a_floor_has_none() -> None:
    assert floor_for_url("nosuch://x") is None


# -- local servers ---------------------------------------------------------------------------


class _FakeServer:
    url = "memory://"
    version = "0"

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


STARTED: list[_FakeServer] = []


def start_fake(where: Path) -> _FakeServer:
    assert where.is_dir()
    STARTED.append(_FakeServer())
    return STARTED[-1]


def start_broken() -> Any:
    from idemstore.local_servers import ServerUnavailableError

    raise ServerUnavailableError("fake-server is not on PATH")


@pytest.fixture
def fake_launchers() -> Iterator[list[Launcher]]:
    STARTED.clear()
    yield [
        Launcher("absent", "idemstore.local_servers.absent", "start_absent"),
        Launcher("broken", __name__, "start_broken", takes_dir=False),
        Launcher("fake", __name__, "start_fake"),
    ]
    STARTED.clear()


def test_missing_launchers_and_binaries_are_reported_not_fatal(
    tmp_path: Path, fake_launchers: list[Launcher]
) -> None:
    running, missing = start_local_servers(tmp_path, fake_launchers)
    assert [s.backend for s in running] == ["fake"] and running[0].version == "0"
    reasons = {u.backend: u.reason for u in missing}
    assert "no launcher idemstore.local_servers.absent.start_absent" in reasons["absent"]
    assert "fake-server is not on PATH" in reasons["broken"]
    stop_local_servers(running)
    assert STARTED[0].stopped


# -- statistics and report -------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    samples = list(range(1, 1001))
    assert percentile(samples, 0.5) == 500
    assert percentile(samples, 0.999) == 999
    assert percentile([7], 0.999) == 7
    assert percentile(list(range(1, 11)), 0.9) == 9


def test_a_run_states_how_idle_cpus_wait_where_linux_exposes_it(tmp_path: Path) -> None:
    assert cpu_idle(tmp_path) is None  # no cpuidle in sysfs: nothing to state
    cpuidle = tmp_path / "devices/system/cpu/cpuidle"
    cpuidle.mkdir(parents=True)
    (cpuidle / "current_driver").write_text("acpi_idle\n")
    assert cpu_idle(tmp_path) == "cpuidle acpi_idle"
    (cpuidle / "current_driver").write_text("haltpoll\n")
    poll = tmp_path / "module/haltpoll/parameters/guest_halt_poll_ns"
    poll.parent.mkdir(parents=True)
    poll.write_text("0\n")
    assert cpu_idle(tmp_path) == "cpuidle haltpoll, guest_halt_poll_ns 0"
    result = BenchResult(meta={"machine": "AMD EPYC", "cpus": 2, "cpu_idle": cpu_idle(tmp_path)})
    assert "- machine: AMD EPYC, 2 CPUs, cpuidle haltpoll, guest_halt_poll_ns 0" in to_markdown(
        result
    )


def test_the_proxy_note_appears_in_the_proxy_section_only() -> None:

    timing = Timing(latencies_ns=[1000, 2000], seconds=0.01, executions=1, unique_keys=1)
    proxy_notes = {"added_p50_ms": 0.25, "identical_calls": 5, "direct_executions": 5}
    result = BenchResult(
        measurements=[
            Measurement("memory", "fresh", 1, timing, floor=timing),
            Measurement("mcp proxy", "proxy", 1, timing, floor=timing, notes=proxy_notes),
            Measurement("memory", "replay", 1, timing, floor=timing),
        ]
    )
    text = to_markdown(result)
    assert text.count("Added latency through the proxy: p50 +0.250 ms.") == 1
    proxy_section = text.split("## proxy", 1)[1].split("## replay", 1)[0]
    assert "Added latency through the proxy" in proxy_section


def test_a_duplicate_execution_is_flagged_in_every_output() -> None:

    doubled = Timing(latencies_ns=[1000, 2000], seconds=0.01, executions=2, unique_keys=1)
    result = BenchResult(
        measurements=[
            Measurement("memory", "contention", 2, doubled, expected_executions=1, floor=doubled)
        ]
    )
    assert result.violations == result.measurements
    assert result.to_dict()["results"][0]["exactly_once"] is False
    assert "2/1 !" in to_markdown(result)
    from io import StringIO

    table = StringIO()
    print_table(result, table)
    assert "NOT exactly once" in table.getvalue()


@pytest.mark.parametrize(
    "url_fixture", ["redis_store_url", "postgres_store_url", "dynamodb_store_url"]
)
async def test_server_floors_claim_once_and_finish_what_they_claimed(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    floor = floor_for_url(request.getfixturevalue(url_fixture))
    assert floor is not None
    await floor.open()
    try:
        assert await floor.put("k", b"v") is True
        await floor.finish("k", b"w")  # the bare write a complete is
        assert await floor.put("k", b"v") is False
    finally:
        await floor.close()
