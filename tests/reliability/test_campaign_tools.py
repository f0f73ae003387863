"""The tools that turn a campaign into published numbers: the fault-table writer and the
soak's leak judgement."""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import pytest

from tests.reliability.fault_table import (
    BEGIN,
    END,
    ENGINE_FAILOVER_BEGIN,
    ENGINE_FAILOVER_END,
    FAILOVER_BEGIN,
    FAILOVER_END,
    main,
    render,
    render_clocks,
    render_cluster_partitions,
    render_engine_failovers,
    render_failovers,
    render_partitions,
    render_sentinel_partitions,
    replace_between_markers,
)
from tests.reliability.soak import fit_slope, judge

if TYPE_CHECKING:
    from pathlib import Path


def history(backend: str, **counts: object) -> dict[str, object]:
    base = {"backend": backend, "fault": "sigkill", "attempts": 10, "keys": 2, "executions": 3}
    return {**base, **counts}


def test_fault_table_sums_the_runs_of_one_fault_and_backend() -> None:
    rows = [
        history("redis", kills=60, takeovers=4, **{"re-executions": 5}),
        history("redis", kills=40, takeovers=1, **{"re-executions": 1, "duplicates found": 0}),
        history("postgres", kills=100, max_call_seconds={"reserve": 0.25, "wait": 1.5}),
        {"backend": "redis", "fault": "latency", "p50": 1.0},  # no history: left out
    ]
    table = render(rows).splitlines()
    assert len(table) == 4  # header, rule, two rows
    (redis,) = [line for line in table if "| redis |" in line]
    cells = dict(zip(columns(table[0]), columns(redis), strict=True))
    assert (cells["fault"], cells["backend"], cells["runs"]) == ("sigkill", "redis", "2")
    assert cells["worker kills"] == "100"
    assert (cells["re-executions"], cells["takeovers"]) == ("6", "5")
    (postgres,) = [line for line in table if "| postgres |" in line]
    assert "1.50" in postgres  # the longest call of any operation


def columns(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_fault_table_sums_the_pause_counts_into_a_sigstop_row() -> None:
    def paused(pauses: int, past: int, fenced: int, refused: int) -> dict[str, object]:
        counts = {
            "pauses": pauses,
            "paused past their lease": past,
            "paused owners fenced out": fenced,
            "stale owners fenced out": fenced + 1,
            "extends refused": refused,
            "lost acknowledgements": 0,
        }
        return history("sqlite-file", fault="sigstop", **counts)

    rows = [paused(3, 4, 4, 0), paused(40, 52, 50, 6), history("sqlite-file", kills=6)]
    table = render(rows).splitlines()
    assert len(table) == 4  # header, rule, one sigstop and one sigkill row
    header = columns(table[0])
    (sigstop,) = [
        dict(zip(header, columns(line), strict=True)) for line in table if "sigstop" in line
    ]
    assert sigstop["runs"] == "2"
    assert sigstop["worker pauses"] == "43"
    assert sigstop["paused past their lease"] == "56"
    assert sigstop["paused owners fenced out"] == "54"
    assert sigstop["stale owners fenced out"] == "56"
    assert sigstop["extends refused"] == "6"
    assert sigstop["worker kills"] == "0"
    (sigkill,) = [
        dict(zip(header, columns(line), strict=True)) for line in table if "sigkill" in line
    ]
    assert (sigkill["worker kills"], sigkill["worker pauses"]) == ("6", "0")
    assert sigkill["lost acknowledgements"] == "0"


def test_the_fault_table_replaces_only_the_text_between_its_markers() -> None:
    page = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    written = replace_between_markers(page, "| new |")
    assert written == f"intro\n{BEGIN}\n| new |\n{END}\noutro\n"
    with pytest.raises(ValueError):
        replace_between_markers("no markers", "| new |")


def test_the_failover_table_has_one_line_per_sentinel_setting_in_order() -> None:
    def failover(wait: int, acked: int, lost: int) -> dict[str, object]:
        return {
            "backend": "redis-sentinel",
            "fault": "failover",
            "wait_replicas": wait,
            "acknowledged completions": acked,
            "lost after failover": lost,
            "keys that would run again": lost,
            "typed errors": 7,
            "promotion seconds": 2.3,
            "complete p50 ms": 1.5,
            "complete p99 ms": 5.2,
        }

    rows = [failover(1, 120, 0), history("redis"), failover(0, 900, 3)]
    table = render_failovers(rows).splitlines()
    assert len(table) == 4  # header, rule, one line per setting, the history left out
    assert table[2].startswith("| `wait_replicas=0` | 900 | 3 | 3 | 7 | 2.3 s | 1.5 / 5.2 ms |")
    assert table[3].startswith("| `wait_replicas=1` | 120 | 0 | 0 |")
    page = f"{BEGIN}\nold\n{END}\n{FAILOVER_BEGIN}\nold\n{FAILOVER_END}\n"
    written = replace_between_markers(page, "| f |", FAILOVER_BEGIN, FAILOVER_END)
    assert written == f"{BEGIN}\nold\n{END}\n{FAILOVER_BEGIN}\n| f |\n{FAILOVER_END}\n"


def test_the_engine_failover_table_has_one_line_per_engine_and_setting() -> None:
    def failover(backend: str, setting: str, lost: int) -> dict[str, object]:
        return {
            "backend": backend,
            "fault": "failover",
            "setting": setting,
            "standby": "streaming",
            "acknowledged completions": 500,
            "lost after failover": lost,
            "keys that would run again": lost,
            "typed errors": 12,
            "error types": ["StoreUnavailableError"],
            "untyped errors": 0,
            "promotion seconds": 0.4,
            "recovery seconds": 0.3,
            "longest call seconds": 0.1,
        }

    rows = [
        failover("redis-cluster", "wait_replicas=0", 2),
        failover("postgres", "synchronous", 0),
        {"backend": "redis-sentinel", "fault": "failover", "wait_replicas": 1},
        history("postgres"),
        failover("postgres", "asynchronous", 1),
    ]
    table = render_engine_failovers(rows).splitlines()
    assert len(table) == 5  # header, rule, three runs; Sentinel and the history left out
    assert table[2] == (
        "| postgres | asynchronous | streaming | 500 | 1 | 1 | 12 (`StoreUnavailableError`) | 0 "
        "| 0.4 s | 0.3 s | 0.1 s |"
    )
    assert table[3].startswith("| postgres | synchronous | streaming | 500 | 0 | 0 |")
    assert table[4].startswith("| redis-cluster | wait_replicas=0 | streaming | 500 | 2 | 2 |")
    page = (
        f"{FAILOVER_BEGIN}\nkept\n{FAILOVER_END}\n"
        f"{ENGINE_FAILOVER_BEGIN}\nold\n{ENGINE_FAILOVER_END}"
    )
    written = replace_between_markers(page, "| e |", ENGINE_FAILOVER_BEGIN, ENGINE_FAILOVER_END)
    assert "kept" in written and "old" not in written and "| e |" in written


def test_a_report_of_failovers_only_rewrites_their_table_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    row = {"backend": "postgres", "fault": "failover", "setting": "asynchronous"}
    report = tmp_path / "report.jsonl"
    report.write_text(json.dumps(row) + "\n")
    page = tmp_path / "page.md"
    page.write_text(
        f"{BEGIN}\nfault table\n{END}\n{FAILOVER_BEGIN}\nsentinel\n{FAILOVER_END}\n"
        f"{ENGINE_FAILOVER_BEGIN}\nold\n{ENGINE_FAILOVER_END}\n"
    )
    main([str(report), str(page)])
    written = page.read_text()
    assert "fault table" in written and "sentinel" in written
    assert "old" not in written and "| postgres | asynchronous |" in written


def samples(
    per_second: dict[str, float], noise: float, seconds: int = 600
) -> list[dict[str, float]]:
    rng = random.Random(7)
    rows = []
    for t in range(0, seconds, 5):
        row = {"t": float(t), "ops": t * 100, "executions": t * 50, "errors": 0}
        row["untyped_errors"] = 0
        for name, base in (
            ("in_use_mib", 40.0),
            ("rss_mib", 50.0),
            ("open_fds", 70.0),
            ("asyncio_tasks", 110.0),
            ("gc_objects", 50_000.0),
            ("engine_connections", 65.0),
        ):
            row[name] = base + per_second.get(name, 0.0) * t + rng.uniform(-noise, noise)
        rows.append(row)
    return rows


def test_noise_around_a_flat_line_passes_the_soak_judgement() -> None:
    verdict = judge(samples({}, noise=3.0))
    assert verdict["ok"], verdict


def test_a_descriptor_leaked_every_ten_seconds_fails_the_soak_judgement() -> None:
    verdict = judge(samples({"open_fds": 0.1}, noise=1.0))
    assert not verdict["ok"]
    assert not verdict["open_fds"]["ok"]
    assert verdict["in_use_mib"]["ok"]


def test_freed_memory_malloc_keeps_is_reported_but_memory_in_use_is_judged() -> None:
    verdict = judge(samples({"rss_mib": 0.02}, noise=0.5))
    assert verdict["ok"], verdict
    assert verdict["rss_mib"]["drift_over_run"] == pytest.approx(12, abs=1)
    assert "ok" not in verdict["rss_mib"]
    leaking = judge(samples({"in_use_mib": 0.02, "rss_mib": 0.02}, noise=0.5))
    assert not leaking["ok"]
    assert not leaking["in_use_mib"]["ok"]


def test_fit_slope_recovers_a_linear_trend() -> None:
    assert fit_slope([(t, 2.0 * t + 1) for t in range(10)]) == pytest.approx(2.0)
    assert fit_slope([(0.0, 5.0)]) == 0.0


def test_clock_rows_make_their_own_table_and_stay_out_of_the_fault_table() -> None:
    rows = [
        {
            "fault": "clock step",
            "backend": "redis",
            "offset seconds": 5.0,
            "attempts": 9,
            "executions": 4,
            "takeovers": 1,
            "duplicates found": 1,
            "acknowledged completions": 3,
        },
        {
            "fault": "clock step",
            "backend": "redis",
            "offset seconds": 5.0,
            "attempts": 9,
            "executions": 6,
            "takeovers": 0,
            "duplicates found": 0,
            "acknowledged completions": 5,
        },
        {
            "fault": "failover to a skewed standby",
            "backend": "postgres",
            "offset seconds": -1.0,
            "attempts": 9,
            "executions": 2,
            "warned before the failover": False,
        },
    ]
    assert render(rows).splitlines()[2:] == []
    table = render_clocks(rows).splitlines()
    assert table[2] == "| clock step | redis | +5 s | 2 | 10 | 1 | 1 | 0 | 8 | 0 | 0 |  |"
    assert table[3].startswith("| failover to a skewed standby | postgres | -1 s | 1 | 2 |")
    assert table[3].endswith("| 0 of 1 |")


def test_sentinel_partition_rows_make_their_own_table() -> None:
    rows = [
        {
            "fault": "partition",
            "backend": "redis-sentinel",
            "setting": "`wait_replicas=0`",
            "acknowledged completions": 10,
            "acknowledged by the cut-off primary": 4,
            "lost by clients following Sentinel": 0,
            "lost by clients beside the primary": 4,
            "keys that would run again": 4,
            "typed errors": 2,
            "error types": [],
            "untyped errors": 0,
            "promotion seconds": 3.0,
            "recovery seconds": 0.0,
            "longest call seconds": 1.5,
        },
    ]
    assert render_partitions(rows).splitlines()[2:] == []
    assert render_sentinel_partitions(rows).splitlines()[2] == (
        "| `wait_replicas=0` | 10 | 4 | 0 | 4 | 4 | 2 | 0 | 3.0 s | 0.0 s | 1.5 s |"
    )


def test_partition_rows_make_their_own_table() -> None:
    rows = [
        {
            "fault": "partition",
            "backend": "postgres",
            "setting": "asynchronous",
            "acknowledged completions": 10,
            "acknowledged by the cut-off primary": 4,
            "lost": 4,
            "lost acknowledged between the cut and the promotion": 3,
            "lost acknowledged between the promotion and the fence": 1,
            "keys that would run again": 4,
            "typed errors": 2,
            "error types": ["StoreUnavailableError"],
            "untyped errors": 0,
            "recovery seconds": 2.5,
            "longest call seconds": 4.0,
        },
    ]
    assert render(rows).splitlines()[2:] == []
    assert render_sentinel_partitions(rows).splitlines()[2:] == []
    assert render_partitions(rows).splitlines()[2] == (
        "| postgres | asynchronous | 10 | 4 | 3 | 1 | 4 | 2 (`StoreUnavailableError`) | 0 "
        "| 2.5 s | 4.0 s |"
    )


def test_cluster_partition_rows_make_their_own_table() -> None:
    rows = [
        {
            "fault": "partition",
            "backend": "redis-cluster",
            "setting": "`wait_replicas=0`",
            "acknowledged completions": 10,
            "acknowledged by the cut-off primary": 4,
            "last acknowledgement by the cut-off primary seconds after the cut": 2.1,
            "lost": 4,
            "lost by clients following the cluster": 0,
            "lost by clients beside the primary": 4,
            "keys that would run again": 4,
            "typed errors": 2,
            "error types": ["StoreUnavailableError"],
            "untyped errors": 0,
            "promotion seconds": 4.0,
            "followers acknowledged again seconds after the cut": 4.2,
            "acknowledged by the followers between the promotion and the heal": 0,
            "recovery seconds": 0.0,
            "rejoined as a replica seconds": 0.5,
            "longest call seconds": 1.5,
        },
    ]
    assert render_partitions(rows).splitlines()[2:] == []
    assert render_sentinel_partitions(rows).splitlines()[2:] == []
    assert render_cluster_partitions(rows).splitlines()[2] == (
        "| `wait_replicas=0` | 10 | 4 | 2.1 s | 0 | 4 | 4 | 2 (`StoreUnavailableError`) | 0 "
        "| 4.0 s | 4.2 s | 0 | 0.5 s | 1.5 s |"
    )
