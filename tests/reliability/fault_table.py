"""Write the campaign's tables into docs/reliability.md from the JSON lines the reliability
tests append to $IDEMSTORE_RELIABILITY_REPORT (see conftest.py ``report_counts``): the fault
table (one line per fault and backend), the failover table (one line per Sentinel setting) and
the engine failover table (one line per PostgreSQL or Redis Cluster configuration).

    python -m tests.reliability.fault_table REPORT.jsonl docs/reliability.md

Only the text between each table's two marker comments is replaced, so the page's prose stays
hand written while every number in the tables comes from the run.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = [
    "BEGIN",
    "CLOCK_BEGIN",
    "CLOCK_END",
    "PARTITION_BEGIN",
    "PARTITION_END",
    "SENTINEL_PARTITION_BEGIN",
    "SENTINEL_PARTITION_END",
    "CLUSTER_PARTITION_BEGIN",
    "CLUSTER_PARTITION_END",
    "END",
    "ENGINE_FAILOVER_BEGIN",
    "ENGINE_FAILOVER_END",
    "FAILOVER_BEGIN",
    "FAILOVER_END",
    "render",
    "render_clocks",
    "render_partitions",
    "render_sentinel_partitions",
    "render_cluster_partitions",
    "render_engine_failovers",
    "render_failovers",
    "replace_between_markers",
]

BEGIN = "<!-- fault-table:begin (written by python -m tests.reliability.fault_table) -->"
END = "<!-- fault-table:end -->"
FAILOVER_BEGIN = (
    "<!-- failover-table:begin (written by python -m tests.reliability.fault_table) -->"
)
FAILOVER_END = "<!-- failover-table:end -->"
ENGINE_FAILOVER_BEGIN = (
    "<!-- engine-failover-table:begin (written by python -m tests.reliability.fault_table) -->"
)
ENGINE_FAILOVER_END = "<!-- engine-failover-table:end -->"
CLOCK_BEGIN = "<!-- clock-table:begin (written by python -m tests.reliability.fault_table) -->"
CLOCK_END = "<!-- clock-table:end -->"
# Faults with a table of their own (test_clock_scenarios): not rows of the fault table.
CLOCK_FAULTS = ("clock step", "client clocks disagree", "failover to a skewed standby")
PARTITION_BEGIN = (
    "<!-- partition-table:begin (written by python -m tests.reliability.fault_table) -->"
)
PARTITION_END = "<!-- partition-table:end -->"
SENTINEL_PARTITION_BEGIN = (
    "<!-- sentinel-partition-table:begin (written by python -m tests.reliability.fault_table) -->"
)
SENTINEL_PARTITION_END = "<!-- sentinel-partition-table:end -->"
CLUSTER_PARTITION_BEGIN = (
    "<!-- cluster-partition-table:begin (written by python -m tests.reliability.fault_table) -->"
)
CLUSTER_PARTITION_END = "<!-- cluster-partition-table:end -->"
# Partitions of a primary from its replicas, with a table each (not rows of the single-server
# partition table).
_REPLICATED_PARTITIONS = ("redis-sentinel", "redis-cluster")
# The engines test_failover.py fails over (Sentinel has its own table, above).
_FAILOVER_ENGINES = ("postgres", "redis-cluster")

# (column title, how to read it from one run's counts)
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("runs", "runs"),
    ("worker kills", "kills"),
    ("worker pauses", "pauses"),
    ("engine faults", "engine faults"),
    ("attempts", "attempts"),
    ("keys", "keys"),
    ("executions", "executions"),
    ("cut off by a kill", "killed in mid-work"),
    ("re-executions", "re-executions"),
    ("takeovers", "takeovers"),
    ("paused past their lease", "paused past their lease"),
    ("paused owners fenced out", "paused owners fenced out"),
    ("stale owners fenced out", "stale owners fenced out"),
    ("extends refused", "extends refused"),
    ("typed errors", "errors"),
    ("untyped errors", "untyped errors"),
    ("hangs", "hangs"),
    ("longest call (s)", "longest call"),
    ("duplicates found", "duplicates found"),
    ("lost acknowledgements", "lost acknowledgements"),
)

# Counters a scenario adds to a run that are engine-side faults (restarts, failovers, throttles).
_ENGINE_FAULTS = (
    "engine restarts",
    "failovers",
    "throttled requests",
    "pgbouncer restarts",
    "connections reset",
)


def _fold(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = defaultdict(int)
    longest = 0.0
    for row in rows:
        total["runs"] += 1
        for name in ("kills", "pauses", "attempts", "keys", "executions", "killed in mid-work"):
            total[name] += int(row.get(name, 0))
        for name in (
            "re-executions",
            "takeovers",
            "paused past their lease",
            "paused owners fenced out",
            "stale owners fenced out",
            "extends refused",
            "errors",
            "untyped errors",
            "hangs",
            "duplicates found",
            "lost acknowledgements",
        ):
            total[name] += int(row.get(name, 0))
        total["engine faults"] += sum(int(row.get(name, 0)) for name in _ENGINE_FAULTS)
        seconds = row.get("max_call_seconds") or {}
        if isinstance(seconds, dict) and seconds:
            longest = max(longest, *(float(v) for v in seconds.values()))
    total["longest call"] = f"{longest:.2f}"
    return total


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table: one line per (fault, backend), runs of the same pair summed."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if "attempts" not in row or row.get("fault") in CLOCK_FAULTS:
            continue  # a measurement without a history (e.g. a latency figure), or a clock
        groups[(str(row.get("fault", "?")), str(row.get("backend", "?")))].append(row)
    header = "| fault | backend | " + " | ".join(title for title, _ in _COLUMNS) + " |"
    rule = "|" + "---|" * (len(_COLUMNS) + 2)
    lines = [header, rule]
    for (fault, backend), runs in sorted(groups.items()):
        folded = _fold(runs)
        cells = [str(folded.get(name, 0)) for _, name in _COLUMNS]
        lines.append(f"| {fault} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _failovers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r for r in rows if r.get("backend") == "redis-sentinel" and r.get("fault") == "failover"
    ]


def render_failovers(rows: list[dict[str, Any]]) -> str:
    """The Sentinel failover table: one line per run of ``test_redis_sentinel``."""
    lines = [
        "| setting | acknowledged completions | lost after failover | keys that would run again"
        " | typed errors | promotion | `complete` p50 / p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in sorted(_failovers(rows), key=lambda r: int(r.get("wait_replicas", 0))):
        lines.append(
            f"| `wait_replicas={run.get('wait_replicas', 0)}` "
            f"| {run.get('acknowledged completions', 0)} "
            f"| {run.get('lost after failover', 0)} "
            f"| {run.get('keys that would run again', 0)} "
            f"| {run.get('typed errors', 0)} "
            f"| {run.get('promotion seconds', '?')} s "
            f"| {run.get('complete p50 ms', '?')} / {run.get('complete p99 ms', '?')} ms |"
        )
    return "\n".join(lines)


def _engine_failovers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r for r in rows if r.get("backend") in _FAILOVER_ENGINES and r.get("fault") == "failover"
    ]


def render_engine_failovers(rows: list[dict[str, Any]]) -> str:
    """The PostgreSQL and Redis Cluster failover table: one line per run of
    ``test_failover``, by engine and setting."""
    lines = [
        "| engine | replication | replica at the crash | acknowledged completions"
        " | lost after failover | keys that would run again | typed errors | untyped errors"
        " | promotion | recovered after | longest call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(
        _engine_failovers(rows),
        key=lambda r: (str(r["backend"]), str(r.get("setting")), str(r.get("standby"))),
    ):
        types = ", ".join(f"`{name}`" for name in run.get("error types", []))
        lines.append(
            f"| {run['backend']} | {run.get('setting', '?')} | {run.get('standby', '?')} "
            f"| {run.get('acknowledged completions', 0)} "
            f"| {run.get('lost after failover', 0)} "
            f"| {run.get('keys that would run again', 0)} "
            f"| {run.get('typed errors', 0)}{f' ({types})' if types else ''} "
            f"| {run.get('untyped errors', 0)} "
            f"| {run.get('promotion seconds', '?')} s "
            f"| {run.get('recovery seconds', '?')} s "
            f"| {run.get('longest call seconds', '?')} s |"
        )
    return "\n".join(lines)


def _clocks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("fault") in CLOCK_FAULTS]


def render_clocks(rows: list[dict[str, Any]]) -> str:
    """The clock table (test_clock_scenarios): one line per fault, backend and offset."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in _clocks(rows):
        groups[(str(row["fault"]), str(row["backend"]), float(row["offset seconds"]))].append(row)
    lines = [
        "| fault | backend | clock off by | runs | executions | takeovers"
        " | executions that overlapped | stale owners fenced out | acknowledged completions"
        " | lost acknowledgements | untyped errors | store warned before the failover |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (fault, backend, offset), runs in sorted(groups.items()):

        def total(name: str, runs: list[dict[str, Any]] = runs) -> int:
            return sum(int(run.get(name, 0)) for run in runs)

        warned = [
            run["warned before the failover"] for run in runs if "warned before the failover" in run
        ]
        lines.append(
            f"| {fault} | {backend} | {offset:+g} s | {len(runs)} | {total('executions')} "
            f"| {total('takeovers')} | {total('duplicates found')} "
            f"| {total('stale owners fenced out')} | {total('acknowledged completions')} "
            f"| {total('lost acknowledgements')} | {total('untyped errors')} "
            f"| {f'{sum(warned)} of {len(warned)}' if warned else ''} |"
        )
    return "\n".join(lines)


def _partitions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if r.get("fault") == "partition" and r["backend"] not in _REPLICATED_PARTITIONS
    ]


def _sentinel_partitions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("fault") == "partition" and r["backend"] == "redis-sentinel"]


def render_sentinel_partitions(rows: list[dict[str, Any]]) -> str:
    """The Sentinel partition table: one line per run of ``test_partitions``' Sentinel test."""
    lines = [
        "| setting | acknowledged completions | acknowledged by the cut-off primary"
        " | lost: clients following Sentinel | lost: clients beside the primary"
        " | keys that would run again | typed errors | untyped errors | promotion"
        " | recovered after the heal | longest call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(_sentinel_partitions(rows), key=lambda r: str(r["setting"])):
        types = ", ".join(f"`{name}`" for name in run.get("error types", []))
        lines.append(
            f"| {run['setting']} | {run.get('acknowledged completions', 0)} "
            f"| {run.get('acknowledged by the cut-off primary', 0)} "
            f"| {run.get('lost by clients following Sentinel', 0)} "
            f"| {run.get('lost by clients beside the primary', 0)} "
            f"| {run.get('keys that would run again', 0)} "
            f"| {run.get('typed errors', 0)}{f' ({types})' if types else ''} "
            f"| {run.get('untyped errors', 0)} | {run.get('promotion seconds', '?')} s "
            f"| {run.get('recovery seconds', '?')} s | {run.get('longest call seconds', '?')} s |"
        )
    return "\n".join(lines)


def _cluster_partitions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("fault") == "partition" and r["backend"] == "redis-cluster"]


def render_cluster_partitions(rows: list[dict[str, Any]]) -> str:
    """The Redis Cluster partition table: one line per run of ``test_partitions``' cluster
    test (a primary cut off in the minority)."""
    lines = [
        "| setting | acknowledged completions | acknowledged by the cut-off primary"
        " | its last acknowledgement after the cut"
        " | lost: clients following the cluster | lost: clients beside the primary"
        " | keys that would run again | typed errors | untyped errors | promotion"
        " | followers acknowledged again after the cut"
        " | followers' acknowledgements between the promotion and the heal"
        " | rejoined as a replica after the heal | longest call |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(_cluster_partitions(rows), key=lambda r: str(r["setting"])):
        types = ", ".join(f"`{name}`" for name in run.get("error types", []))
        last = run.get("last acknowledgement by the cut-off primary seconds after the cut", "?")
        lines.append(
            f"| {run['setting']} | {run.get('acknowledged completions', 0)} "
            f"| {run.get('acknowledged by the cut-off primary', 0)} | {last} s "
            f"| {run.get('lost by clients following the cluster', 0)} "
            f"| {run.get('lost by clients beside the primary', 0)} "
            f"| {run.get('keys that would run again', 0)} "
            f"| {run.get('typed errors', 0)}{f' ({types})' if types else ''} "
            f"| {run.get('untyped errors', 0)} | {run.get('promotion seconds', '?')} s "
            f"| {run.get('followers acknowledged again seconds after the cut', '?')} s "
            f"| {run.get('acknowledged by the followers between the promotion and the heal', '?')} "
            f"| {run.get('rejoined as a replica seconds', '?')} s "
            f"| {run.get('longest call seconds', '?')} s |"
        )
    return "\n".join(lines)


def render_partitions(rows: list[dict[str, Any]]) -> str:
    """The partition table: one line per run of ``test_partitions`` (a single server cut off
    from its clients has no promotion: its loss is in the first loss column)."""
    lines = [
        "| engine | replication, or what was cut off | acknowledged completions"
        " | acknowledged by the cut-off primary"
        " | lost: acknowledged between the cut and the promotion | lost: between the promotion"
        " and the fence | keys that would run again | typed errors | untyped errors"
        " | recovered after the fence (or the heal) | longest call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(_partitions(rows), key=lambda r: (str(r["backend"]), str(r["setting"]))):
        types = ", ".join(f"`{name}`" for name in run.get("error types", []))
        lines.append(
            f"| {run['backend']} | {run['setting']} | {run.get('acknowledged completions', 0)} "
            f"| {run.get('acknowledged by the cut-off primary', 'n/a')} "
            f"| {run.get('lost acknowledged between the cut and the promotion', run['lost'])} "
            f"| {run.get('lost acknowledged between the promotion and the fence', 'n/a')} "
            f"| {run.get('keys that would run again', 0)} "
            f"| {run.get('typed errors', 0)}{f' ({types})' if types else ''} "
            f"| {run.get('untyped errors', 0)} | {run.get('recovery seconds', '?')} s "
            f"| {run.get('longest call seconds', '?')} s |"
        )
    return "\n".join(lines)


def replace_between_markers(page: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``page`` with the text between ``begin`` and ``end`` replaced by ``table``."""
    start = page.index(begin) + len(begin)
    stop = page.index(end, start)
    return f"{page[:start]}\n{table}\n{page[stop:]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("page", type=Path)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]
    page = args.page.read_text(encoding="utf-8")
    if any("attempts" in row and row.get("fault") not in CLOCK_FAULTS for row in rows):
        # A report of other tests only (the failover tests alone, say) keeps the fault table.
        page = replace_between_markers(page, render(rows))
        print(render(rows))
    if _failovers(rows):
        # A run that left the Sentinel tests out keeps the published failover table.
        failovers = render_failovers(rows)
        page = replace_between_markers(page, failovers, FAILOVER_BEGIN, FAILOVER_END)
        print(failovers)
    if _engine_failovers(rows):
        engines = render_engine_failovers(rows)
        page = replace_between_markers(page, engines, ENGINE_FAILOVER_BEGIN, ENGINE_FAILOVER_END)
        print(engines)
    if _partitions(rows):
        partitions = render_partitions(rows)
        page = replace_between_markers(page, partitions, PARTITION_BEGIN, PARTITION_END)
        print(partitions)
    if _sentinel_partitions(rows):
        sentinel = render_sentinel_partitions(rows)
        page = replace_between_markers(
            page, sentinel, SENTINEL_PARTITION_BEGIN, SENTINEL_PARTITION_END
        )
        print(sentinel)
    if _cluster_partitions(rows):
        cluster = render_cluster_partitions(rows)
        page = replace_between_markers(
            page, cluster, CLUSTER_PARTITION_BEGIN, CLUSTER_PARTITION_END
        )
        print(cluster)
    if _clocks(rows):
        clocks = render_clocks(rows)
        page = replace_between_markers(page, clocks, CLOCK_BEGIN, CLOCK_END)
        print(clocks)
    args.page.write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
