"""Turning a ``BenchResult`` into a table, JSON, Markdown and charts.

The table goes to stdout (rich when installed, plain text otherwise); ``write_outputs`` writes
``results.json``, ``results.md`` and, when matplotlib is installed (the ``bench`` extra),
``latency.png`` and ``throughput.png``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from idemstore.bench.cost_scenario import cost_note
from idemstore.bench.peers_scenario import peer_note
from idemstore.bench.telemetry_overhead import RERUN as TELEMETRY_RERUN
from idemstore.install_lines import install_hint

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.bench.results import BenchResult, Measurement

__all__ = [
    "COLUMNS",
    "LEGEND",
    "NARROW_COLUMNS",
    "SCENARIO_LEGEND",
    "legend",
    "note_lines",
    "print_table",
    "render_table",
    "scenario_legend",
    "rows",
    "terminal_width",
    "text_table",
    "to_json",
    "to_markdown",
    "write_outputs",
]

# Latencies in milliseconds. "x floor" columns are ratios to the engine's floor (results.py).
COLUMNS: tuple[str, ...] = (
    "backend",
    "scenario",
    "workers",
    "ops",
    "ops/s",
    "p50",
    "p90",
    "p99",
    "p99.9",
    "floor p50",
    "x floor p50",
    "x floor ops/s",
    "exec/keys",
    "errors",
)
# The default terminal table: what a reader compares, within 80 columns (--wide: COLUMNS).
NARROW_COLUMNS: tuple[str, ...] = (
    "backend",
    "scenario",
    "workers",
    "ops/s",
    "p50",
    "p99",
    "floor p50",
    "x floor p50",
    "x floor ops/s",
    "exec/keys",
)
# Names the narrow table shows shorter (the markdown and --wide keep the long ones). The two
# ratios name their division: both are "times the floor's cost", so one is ours over the
# floor (a latency) and the other the floor over ours (a rate).
SHORT_NAMES = {
    "workers": "c",
    "floor p50": "floor",
    "x floor p50": "p50/fl",
    "x floor ops/s": "fl/ops",
    "exec/keys": "once",
}
# What each column means, by the name a table shows: printed under the table, in results.md,
# and docs/benchmarks.md explains every one (a test checks).
LEGEND: dict[str, str] = {
    "c": "workers",
    "workers": "concurrent workers",
    "ops": "operations timed",
    "floor": "p50 of the same work without idemstore, same run (a store: its raw driver)",
    "floor p50": "p50 of the same work without idemstore, same run (a store: its raw driver)",
    "p50/fl": "our p50 / the floor's",
    "x floor p50": "our p50 / floor p50",
    "fl/ops": "the floor's ops/s / ours (both ratios: times the floor's cost; 1.00: idemstore"
    " adds nothing, lower is better)",
    "x floor ops/s": "the floor's ops/s / ours (both x floor columns: times the floor's cost;"
    " 1.00: idemstore adds nothing, lower is better)",
    "once": "every key ran exactly once (NO: a correctness failure)",
    "exec/keys": "executions / keys that should each run once (! marks a mismatch)",
    "errors": "operations that raised",
}
# What each scenario's rows measure, in a phrase: the legend names those the table shows
# (docs/benchmarks.md, "Scenarios", says more; a test checks every scenario has one).
SCENARIO_LEGEND: dict[str, str] = {
    "fresh": "a new key each operation (reserve + complete)",
    "reserve": "a new key each operation, reserve alone",
    "replay": "answering a retry of a completed key",
    "contention": "workers racing on the same keys",
    "mixed": "new keys and 20% retries",
    "commands": "engine commands per operation",
    "wake": "from complete to a waiting caller's return (no floor)",
    "replay-writes": "whether replays write to the store",
    "replay-cache": "a replay from CachedStore in memory (floor: the engine's replay)",
    "hasher": "hashing tool-call arguments (floor: json.dumps(sort_keys=True) + SHA-256)",
    "proxy": "a tools/call through idemstore proxy (floor: the server called directly)",
    "gateway": "a tools/call through idemstore gateway (floor: the endpoint called directly)",
    "telemetry": "Idempotency.run after instrument() (floor: the same without it)",
    "middleware": "a request through the ASGI middleware (floor: the bare app)",
    "sync": "idemstore.sync from a thread (floor: the async runner)",
    "settle": "settling inside the business transaction (floor: commit, then settle)",
    "peers": "idemstore against another library's door on the same server, first calls"
    " and replays, c callers per side",
    "consumers": "a message through the consumer door vs. the same consumer without it, per broker",
    "cost": "what a record and a call cost each engine (bytes, round trips, WAL), for plan",
}
# The width a table fits when the output is not a terminal (a pipe, a file, a test).
DEFAULT_WIDTH = 80
# The backend column gives way first when a table is too wide, down to this many characters.
MIN_NAME_WIDTH = 8


def terminal_width(out: TextIO) -> int:
    """The columns of the terminal ``out`` writes to, or ``DEFAULT_WIDTH`` when it is none."""
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def legend(header: Sequence[str]) -> str:
    """One line (to be wrapped) explaining the non-obvious columns of ``header``."""
    named = "; ".join(f"{name}: {LEGEND[name]}" for name in header if name in LEGEND)
    return f"Latency in ms. {named}."


def scenario_legend(scenarios: Sequence[str]) -> str:
    """One line (to be wrapped) saying what the rows of each of ``scenarios`` measure."""
    # A scenario with several kinds of rows names them "<scenario>-<kind>" (peers-first).
    names = dict.fromkeys(s if s in SCENARIO_LEGEND else s.rsplit("-", 1)[0] for s in scenarios)
    named = "; ".join(f"{s}: {SCENARIO_LEGEND[s]}" for s in names if s in SCENARIO_LEGEND)
    return f"Scenarios: {named}."


def fmt_ms(value: float | None) -> str:
    """Milliseconds with about three significant digits."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    if value >= 0.01:
        return f"{value:.3f}"
    return f"{value:.4f}"


def fmt_signed_ms(value: float) -> str:
    """A latency difference: ``+0.083`` or ``-0.208``."""
    return ("+" if value >= 0 else "-") + fmt_ms(abs(value))


def fmt_rate(value: float | None, *, wide: bool = True) -> str:
    """Operations per second: ``64,359`` (``wide``), else at most five characters (``64.4k``)."""
    if value is None:
        return "-"
    if wide or value < 10_000:
        return f"{value:,.0f}" if wide else f"{value:.0f}"
    if value < 100_000:
        return f"{value / 1000:.1f}k"
    if value < 1_000_000:
        return f"{value / 1000:.0f}k"
    return f"{value / 1_000_000:.1f}M"


def fmt_ratio(value: float | None, *, wide: bool = True) -> str:
    if value is None:
        return "-"
    if wide or value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _executions(m: Measurement, *, wide: bool = True) -> str:
    if m.expected_executions is None:
        return "-"
    if not wide:
        # The counts (up to six digits each) are for --wide and results.md.
        return "yes" if m.exactly_once else "NO"
    text = f"{m.subject.executions}/{m.expected_executions}"
    direct = m.notes.get("direct_executions")
    if direct is not None and wide:
        text += f" (direct {direct})"
    return text if m.exactly_once else text + " !"


def rows(result: BenchResult, *, wide: bool = True) -> list[list[str]]:
    """The table's cells, one row per measurement, in ``COLUMNS`` order (``wide``: with the
    executions of the proxy's direct calls)."""
    table = []
    for m in result.measurements:
        latency = m.subject.latency_ms()
        floor_p50 = None if m.floor is None else m.floor.latency_ms()["p50"]
        table.append(
            [
                m.backend,
                m.scenario,
                str(m.concurrency),
                str(m.subject.ops),
                fmt_rate(m.subject.ops_per_s, wide=wide),
                fmt_ms(latency["p50"]),
                fmt_ms(latency["p90"]),
                fmt_ms(latency["p99"]),
                fmt_ms(latency["p99.9"]),
                fmt_ms(floor_p50),
                fmt_ratio(m.ratio_p50, wide=wide),
                fmt_ratio(m.ratio_throughput, wide=wide),
                _executions(m, wide=wide),
                str(sum(m.subject.errors.values())),
            ]
        )
    return table


def _select(columns: tuple[str, ...], body: list[list[str]]) -> list[list[str]]:
    picked = [COLUMNS.index(name) for name in columns]
    return [[cells[i] for i in picked] for cells in body]


def note_lines(result: BenchResult) -> list[str]:
    """What the probes found besides latency: commands per op, replay writes, added latency."""
    lines = []
    for m in result.measurements:
        notes = m.notes
        # "mcp proxy proxy" says the scenario twice: the backend's name holds it already.
        where = m.backend if m.scenario in m.backend else f"{m.backend} {m.scenario}"
        if "commands_per_op" in notes:
            counts = ", ".join(f"{k} {v:g}" for k, v in notes["commands_per_op"].items())
            lines.append(f"{where} ({notes['case']}): commands per op: {counts or 'none'}")
        elif m.scenario == "replay-writes":
            rewritten = "rewrote" if notes["row_rewritten"] else "did not rewrite"
            lines.append(
                f"{where}: {notes['replays']} replays {rewritten} the row; the server wrote"
                f" {notes['wal_bytes']} WAL bytes meanwhile, {notes.get('wal_bytes_idle', '?')}"
                " in as long without them"
            )
        elif m.scenario == "replay-cache" and isinstance(notes.get("speedup_p50"), float):
            lines.append(
                f"{where}: a replay from CachedStore is {notes['speedup_p50']:.1f}x as fast"
                " as the engine's at p50"
            )
        elif m.scenario == "middleware" and m.floor is not None:
            ours, bare = m.subject.latency_ms()["p50"], m.floor.latency_ms()["p50"]
            if ours is not None and bare is not None:
                lines.append(f"{where}: {(ours - bare) * 1000:+.0f} µs p50 over the bare app")
        elif m.scenario == "proxy":
            added, relay = notes.get("added_p50_ms"), notes.get("relay_added_p50_ms")
            if isinstance(added, float):
                text = f"{where}: {fmt_signed_ms(added)} ms p50 over the server called directly"
                if isinstance(relay, float):
                    text += f" (a bare stdio relay: {fmt_signed_ms(relay)} ms)"
                lines.append(text)
        elif m.scenario == "hasher" and m.backend.startswith("fingerprint"):
            if "rfc8785_x_p50" in notes:
                # Both rows hash with SHA-256; one line of 80 columns per shape.
                # Which pass ran decides the ratio several times over: say it with it.
                ran = f" ({notes['fingerprint_pass']} pass)" if "fingerprint_pass" in notes else ""
                lines.append(
                    f"hasher {notes['shape']}: fingerprint {notes['rfc8785_x_p50']:.2f}x faster"
                    f" than rfc8785 at p50, {notes['rfc8785_x_ops']:.2f}x in ops/s{ran}"
                )
        elif m.scenario == "gateway":
            lines.extend(_gateway_note(where, notes))
        elif m.scenario == "cost" and (cost := cost_note(m)) is not None:
            lines.append(cost)
        elif (peer := peer_note(m)) is not None:
            lines.append(peer)
        elif m.scenario == "telemetry" and m.backend == TELEMETRY_RERUN:
            lines.append(
                f"telemetry: '{TELEMETRY_RERUN}' is the baseline measured twice; its"
                f" x p50 ({fmt_ratio(m.ratio_p50)}) is this run's noise"
            )
    return lines


def _gateway_note(where: str, notes: dict[str, Any]) -> list[str]:
    """The gateway's added p50 and p99 beside the bare reverse proxy's, when both were measured."""
    parts = []
    for label in ("p50", "p99"):
        added, relay = notes.get(f"added_{label}_ms"), notes.get(f"relay_added_{label}_ms")
        if not isinstance(added, float):
            continue
        text = f"{fmt_signed_ms(added)} ms {label}"
        if isinstance(relay, float):
            times = notes.get(f"relay_x_added_{label}")
            text += f" (a bare reverse proxy: {fmt_signed_ms(relay)} ms"
            text += f", {times:.2f}x)" if isinstance(times, float) else ")"
        parts.append(text)
    if not parts:
        return []
    return [f"{where}: " + ", ".join(parts) + " over the endpoint called directly"]


def _fit(
    header: Sequence[str], body: list[list[str]], width: int | None
) -> tuple[list[int], list[list[str]]]:
    """Column widths, and the body with backend names shortened (``…``) when the table would
    be wider than ``width``; only the first column gives way."""
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) for i in range(len(header))]
    over = 0 if width is None else sum(widths) + _GAP * (len(widths) - 1) - width
    if over > 0 and widths[0] > MIN_NAME_WIDTH:
        widths[0] = max(MIN_NAME_WIDTH, len(header[0]), widths[0] - over)
        body = [
            [r[0] if len(r[0]) <= widths[0] else r[0][: widths[0] - 1] + "…", *r[1:]] for r in body
        ]
    return widths, body


_GAP = 1  # spaces between columns: ten columns in 80 leave no room for more


def text_table(header: Sequence[str], body: list[list[str]], width: int | None = None) -> str:
    """An aligned table (names left, numbers right), no wider than ``width`` when it can be."""
    widths, body = _fit(header, body, width)
    left = {0, 1}  # names left-aligned, numbers right-aligned

    def line(cells: Sequence[str]) -> str:
        return (
            (" " * _GAP)
            .join(
                c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(cells)
            )
            .rstrip()
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def _unavailable_lines(result: BenchResult) -> list[str]:
    """What did not run: each missing extra once, with what it skipped; what does not apply
    here, skipped with why; then the failures ("not measured")."""
    skipped: dict[str, list[str]] = {}
    not_applicable, failed = [], []
    for u in result.unavailable:
        where = u.backend if u.scenario is None else f"{u.backend} ({u.scenario})"
        if u.extra is not None:
            names = skipped.setdefault(u.extra, [])
            name = u.scenario or u.backend
            names += [] if name in names else [name]
        elif u.skipped:
            not_applicable.append(f"{where}: skipped: {u.reason}")
        else:
            failed.append(f"{where}: not measured: {u.reason}")
    skips = [
        f"{', '.join(names)}: skipped (install '[{extra}]')" for extra, names in skipped.items()
    ]
    return skips + not_applicable + failed


def _violation_lines(result: BenchResult) -> list[str]:
    return [
        f"{m.backend} {m.scenario} c={m.concurrency}: {m.subject.executions} executions"
        f" for {m.expected_executions} keys: NOT exactly once"
        for m in result.violations
    ]


def render_table(result: BenchResult, *, width: int | None, wide: bool = False) -> str:
    """The terminal report: the table, its legend, the probes' notes, what did not run and
    any duplicate execution; every line within ``width`` (``None``: no limit)."""
    columns = COLUMNS if wide else NARROW_COLUMNS
    body = _select(columns, rows(result, wide=wide))
    header = columns if wide else tuple(SHORT_NAMES.get(c, c) for c in columns)
    wrap_at = width if width is not None else 10_000
    out: list[str] = []
    if body:
        out += ["idemstore bench", "", text_table(header, body, width), ""]
        out += [*textwrap.wrap(legend(header), wrap_at), ""]
        shown = list(dict.fromkeys(m.scenario for m in result.measurements))
        out += [*textwrap.wrap(scenario_legend(shown), wrap_at), ""]
    for text in [*note_lines(result), *_unavailable_lines(result), *_violation_lines(result)]:
        out += textwrap.wrap(text, wrap_at, subsequent_indent="  ")
    return "\n".join(out)


def print_table(
    result: BenchResult,
    file: TextIO | None = None,
    *,
    wide: bool = False,
    width: int | None = None,
) -> None:
    """The results as a table on ``file`` (stdout), then the legend, the probes' notes and
    what could not run. The table fits ``width`` columns (default: the terminal's, 80 when
    ``file`` is not one); ``wide`` shows every column, however wide."""
    out = file if file is not None else sys.stdout
    limit = None if wide else (width if width is not None else terminal_width(out))
    print(render_table(result, width=limit, wide=wide), file=out)


def to_json(result: BenchResult) -> str:
    return json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _markdown_table(header: tuple[str, ...] | list[str], body: list[list[str]]) -> str:
    aligns = ["---" if i < 2 else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in body]
    return "\n".join(lines)


def to_markdown(result: BenchResult, charts: list[str] | None = None) -> str:
    """A report people read: where it ran, one table per scenario, the charts, the gaps."""
    meta, config = result.meta, result.config
    out = ["# idemstore bench results", ""]
    if meta:
        out.append(f"- idemstore {meta.get('idemstore', '?')}, Python {meta.get('python', '?')}")
        idle = f", {meta['cpu_idle']}" if meta.get("cpu_idle") else ""
        out.append(f"- machine: {meta.get('machine', '?')}, {meta.get('cpus', '?')} CPUs{idle}")
        if meta.get("started_at"):
            out.append(f"- run at {meta['started_at']} for {meta.get('seconds', 0):.0f} s")
        versions = meta.get("versions") or {}
        if versions:
            out.append("- drivers: " + ", ".join(f"{name} {ver}" for name, ver in versions.items()))
        servers = meta.get("servers") or {}
        if servers:
            out.append("- servers: " + ", ".join(f"{name} {ver}" for name, ver in servers.items()))
    if config:
        shape = f"{config['ops']} operations" if config.get("ops") else f"{config['duration']} s"
        out.append(
            f"- load: {shape} per measurement, at"
            f" {', '.join(map(str, config.get('concurrency') or []))} concurrent workers,"
            f" {config.get('payload_bytes')}-byte responses"
        )
        if config.get("command"):
            out.append(f"- command: `{config['command']}`")
    out.append("")
    out.append(legend(COLUMNS))
    body = rows(result)
    scenarios = list(dict.fromkeys(m.scenario for m in result.measurements))
    for scenario in scenarios:
        picked = [
            r for r, m in zip(body, result.measurements, strict=True) if m.scenario == scenario
        ]
        floors = {
            m.backend: m.floor_name
            for m in result.measurements
            if m.scenario == scenario and m.floor_name
        }
        out += ["", f"## {scenario}", "", _markdown_table(COLUMNS, picked)]
        if floors:
            out += ["", "Floors: " + "; ".join(f"{b}: {f}" for b, f in floors.items()) + "."]
        for m in result.measurements:
            if m.scenario != scenario:
                continue  # each section notes its own measurements only
            if m.scenario == "proxy":
                added = ", ".join(
                    f"{k.removeprefix('added_').removesuffix('_ms')} +{fmt_ms(v)} ms"
                    for k, v in m.notes.items()
                    if k.startswith("added_") and isinstance(v, float)
                )
                out += [
                    "",
                    f"Added latency through the proxy: {added or '-'}. {m.notes['identical_calls']}"
                    f" identical calls executed {m.notes['direct_executions']} time(s) directly"
                    f" and {m.subject.executions} time(s) through the proxy.",
                ]
            if m.scenario == "hasher" and m.notes.get("agrees_with_rfc8785") is False:
                out += ["", f"{m.backend} disagrees with rfc8785 on this value."]
    notes = note_lines(result)
    if notes:
        out += ["", "## Probes", ""]
        out += [f"- {line}" for line in notes]
    for name in charts or []:
        out += ["", f"![{Path(name).stem}]({name})"]
    if result.unavailable:
        out += ["", "## Not measured", ""]
        out += [f"- {line}" for line in _unavailable_lines(result)]
    return "\n".join(out) + "\n"


def write_outputs(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write ``results.json``, the charts (when matplotlib is there) and ``results.md``.

    Returns the paths written. Without matplotlib the charts are skipped with a note on stderr.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    json_path = out_dir / "results.json"
    json_path.write_text(to_json(result), encoding="utf-8")
    written.append(json_path)
    charts: list[Path] = []
    if importlib.util.find_spec("matplotlib") is None:
        print(
            f"idemstore bench: no charts: matplotlib is missing: {install_hint('bench')}",
            file=sys.stderr,
        )
    else:
        from idemstore.bench.charts import write_charts

        charts = write_charts(result, out_dir)
    written += charts
    md_path = out_dir / "results.md"
    md_path.write_text(to_markdown(result, [c.name for c in charts]), encoding="utf-8")
    written.append(md_path)
    return written
