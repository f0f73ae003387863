"""The terminal report of ``idemstore bench``: its width, its legend, what it says was skipped."""

from __future__ import annotations

import io
import re
from pathlib import Path

from idemstore.bench.report import (
    COLUMNS,
    LEGEND,
    NARROW_COLUMNS,
    SCENARIO_LEGEND,
    SHORT_NAMES,
    print_table,
    render_table,
    terminal_width,
    to_markdown,
)
from idemstore.bench.results import (
    BenchResult,
    Measurement,
    NotApplicable,
    Timing,
    Unavailable,
    on_each_target,
)
from idemstore.bench.runner import Target
from idemstore.bench.scenarios import SCENARIOS
from idemstore.bench.telemetry_overhead import RERUN

ROOT = Path(__file__).resolve().parent.parent


def timing(p50_ns: int, ops: int = 500, *, executions: int = 0, keys: int = 0) -> Timing:
    # Wide numbers on purpose: six-digit ops/s, a five-digit latency, a three-digit ratio
    # (ops/s is 1 / p50 whatever the count).
    return Timing(
        latencies_ns=[p50_ns] * ops,
        seconds=ops * p50_ns / 1e9,
        executions=executions,
        unique_keys=keys,
    )


PROXY_NOTES = {"identical_calls": 5, "direct_executions": 5, "added_p50_ms": 0.25}
HASHER_NOTES = {
    "shape": "unicode",
    "rfc8785_x_p50": 3.456,
    "rfc8785_x_ops": 2.5,
    "fingerprint_pass": "pure Python",
}
REPLAY_NOTES = {"replays": 200, "row_rewritten": False, "wal_bytes": 0, "wal_bytes_idle": 0}


def a_full_result() -> BenchResult:
    """One measurement of every kind a run produces, with the longest names they have."""
    fast, slow = timing(3_000), timing(12_345_678_901, ops=3)
    result = BenchResult()
    for backend in ("memory", "sqlite", "postgres-2", "redis-cluster"):
        for scenario in ("fresh", "contention", "replay-writes", "wake"):
            for workers in (1, 16, 256):
                result.measurements.append(
                    Measurement(
                        backend,
                        scenario,
                        workers,
                        timing(40_000, executions=2000, keys=2000),
                        floor=fast,
                        expected_executions=2000,
                        notes=REPLAY_NOTES if scenario == "replay-writes" else {},
                    )
                )
    for backend, scenario in (
        ("fingerprint unicode", "hasher"),
        ("sorted json unicode", "hasher"),
        ("mcp proxy", "proxy"),
        ("mcp gateway", "gateway"),
        (RERUN, "telemetry"),
        ("otel, no SDK", "telemetry"),
        ("asgi new key", "middleware"),
    ):
        notes = {"proxy": PROXY_NOTES, "hasher": HASHER_NOTES}.get(scenario, {})
        result.measurements.append(Measurement(backend, scenario, 1, slow, floor=fast, notes=notes))
    return result


def test_the_default_table_fits_80_columns() -> None:
    text = render_table(a_full_result(), width=80)
    assert "otel off, rerun" in text and "replay-writes" in text
    assert "hasher unicode: fingerprint 3.46x faster than rfc8785 at p50, 2.50x" in text
    assert "(pure Python pass)" in text  # the pass decides the ratio: the report names it
    for line in text.splitlines():
        assert len(line) <= 80, line


def test_output_that_is_not_a_terminal_gets_80_columns() -> None:
    out = io.StringIO()
    assert terminal_width(out) == 80
    print_table(a_full_result(), out)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


def test_a_long_backend_name_gives_way_and_the_numbers_stay_whole() -> None:
    result = a_full_result()
    name = "postgres-behind-pgbouncer-in-another-zone"
    result.measurements.append(Measurement(name, "fresh", 1, timing(40_000), floor=timing(3_000)))
    text = render_table(result, width=80)
    row = next(line for line in text.splitlines() if line.startswith("postgres-behind"))
    assert len(row) <= 80 and "…" in row
    assert row.split()[-4:] == ["0.0030", "13.3", "13.3", "-"]
    assert name in render_table(result, width=200)


def test_the_legend_under_the_table_explains_its_columns() -> None:
    text = render_table(a_full_result(), width=80)
    table, after = text.split("\n\n")[1], " ".join(text.split("\n\n")[2].split())
    header = table.splitlines()[0].split()
    assert header[:3] == ["backend", "scenario", "c"]
    for name in ("c", "floor", "p50/fl", "fl/ops", "once"):
        assert f"{name}: " in after


def test_wide_shows_every_column_and_the_exact_counts() -> None:
    text = render_table(a_full_result(), width=None, wide=True)
    header = next(line for line in text.splitlines() if line.startswith("backend"))
    assert re.split(r"\s+", header) == " ".join(COLUMNS).split()
    assert "2000/2000" in text and "exec/keys: " in " ".join(text.split())


def test_every_column_a_table_shows_is_explained_in_the_docs() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = {SHORT_NAMES.get(c, c) for c in NARROW_COLUMNS} | set(COLUMNS)
    for name in sorted(shown & set(LEGEND)):
        assert f"`{name}`" in page, name


def test_a_missing_extra_is_listed_once_as_skipped() -> None:
    result = a_full_result()
    result.unavailable += [
        Unavailable("mcp gateway", "httpx is not installed", "gateway", extra="gateway"),
        Unavailable("mcp gateway", "uvicorn is not installed", "gateway", extra="gateway"),
        Unavailable("dynamodb", "moto is not installed", extra="local"),
        Unavailable("redis", "ConnectionRefusedError: refused"),
    ]
    lines = render_table(result, width=80).splitlines()
    assert lines.count("gateway: skipped (install '[gateway]')") == 1
    assert "dynamodb: skipped (install '[local]')" in lines
    assert "redis: not measured: ConnectionRefusedError: refused" in lines
    assert not any("No module named" in line or "unavailable" in line for line in lines)
    assert "gateway: skipped (install '[gateway]')" in to_markdown(result)


def test_the_telemetry_rerun_is_explained_as_the_noise() -> None:
    text = " ".join(render_table(a_full_result(), width=80).split())
    assert f"'{RERUN}' is the baseline measured twice" in text
    assert "again" not in text


def test_a_negative_difference_reads_as_negative() -> None:
    direct = timing(1_000_000)
    notes = {"added_p50_ms": -0.2, "relay_added_p50_ms": 0.1, "identical_calls": 5}
    result = BenchResult(
        measurements=[Measurement("mcp proxy", "proxy", 1, direct, floor=direct, notes=notes)]
    )
    text = render_table(result, width=80)
    assert "mcp proxy: -0.200 ms p50" in text and "+0.100 ms" in text and "+-" not in text


def test_the_gateway_note_sets_its_added_latency_beside_the_bare_reverse_proxy() -> None:
    direct = timing(1_000_000)
    notes = {
        "added_p50_ms": 0.6,
        "relay_added_p50_ms": 0.4,
        "relay_x_added_p50": 1.5,
        "added_p99_ms": 2.0,
        "relay_added_p99_ms": 1.0,
        "relay_x_added_p99": 2.0,
    }
    result = BenchResult(
        measurements=[Measurement("mcp gateway", "gateway", 1, direct, floor=direct, notes=notes)]
    )
    text = " ".join(render_table(result, width=80).split())
    assert "mcp gateway: +0.600 ms p50 (a bare reverse proxy: +0.400 ms, 1.50x)" in text
    assert "+2.00 ms p99 (a bare reverse proxy: +1.00 ms, 2.00x)" in text


def test_every_scenario_has_a_phrase_in_the_legend() -> None:
    assert set(SCENARIO_LEGEND) == set(SCENARIOS)


def test_the_legend_says_what_each_scenario_shown_measures() -> None:
    result = a_full_result()
    text = " ".join(render_table(result, width=80).split())
    for scenario in {m.scenario for m in result.measurements}:
        assert f"{scenario}: {SCENARIO_LEGEND[scenario]}" in text, scenario


def test_both_ratio_columns_say_their_division_in_their_names() -> None:
    header = next(
        line for line in render_table(a_full_result(), width=80).splitlines() if "once" in line
    )
    assert "p50/fl" in header.split() and "fl/ops" in header.split()
    assert "ours" in LEGEND["fl/ops"] and "floor's ops/s" in LEGEND["fl/ops"]


def test_a_scenario_that_does_not_apply_reads_as_skipped_with_why() -> None:
    result = a_full_result()
    result.unavailable += [
        Unavailable("memory", "settling needs a SQL store", "settle", skipped=True),
        Unavailable("sqlite", "RuntimeError: boom", "settle"),
    ]
    lines = render_table(result, width=80).splitlines()
    assert "memory (settle): skipped: settling needs a SQL store" in lines
    assert "sqlite (settle): not measured: RuntimeError: boom" in lines
    assert lines.index("memory (settle): skipped: settling needs a SQL store") < lines.index(
        "sqlite (settle): not measured: RuntimeError: boom"
    )


async def test_not_applicable_becomes_a_skip_and_an_error_a_failure() -> None:
    async def one(target: Target) -> Measurement:
        if target.name == "memory":
            raise NotApplicable("needs a SQL store")
        raise RuntimeError("boom")

    targets = [Target("memory", "memory://"), Target("sqlite", "sqlite:///x")]
    memory, sqlite = await on_each_target(targets, "settle", one)
    assert memory == Unavailable("memory", "needs a SQL store", "settle", skipped=True)
    assert sqlite == Unavailable("sqlite", "RuntimeError: boom", "settle")
