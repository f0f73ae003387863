"""``latency.png`` and ``throughput.png``: the store scenarios of a run, drawn with matplotlib
(the ``bench`` extra), imported only when charts are written."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from idemstore.bench.scenarios import STORE_SCENARIOS

if TYPE_CHECKING:
    from pathlib import Path

    from idemstore.bench.results import BenchResult, Measurement

__all__ = ["write_charts"]


class _Chart(NamedTuple):
    """What one scenario's plot draws: its measurements, on which backends and levels."""

    scenario: str
    measured: list[Measurement]
    backends: list[str]
    levels: list[int]
    colors: Any


def _store_measurements(result: BenchResult) -> list[Measurement]:
    return [m for m in result.measurements if m.scenario in STORE_SCENARIOS]


def _legend_below(fig: Any, ax: Any) -> None:
    """One legend for the whole figure, under the plots, where it hides no data."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=min(6, len(labels) or 1))
    fig.tight_layout(rect=(0, 0.06, 1, 1))


def write_charts(result: BenchResult, out_dir: Path) -> list[Path]:
    """``latency.png`` and ``throughput.png`` for the store scenarios; none without them."""
    measured = _store_measurements(result)
    if not measured:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [s for s in STORE_SCENARIOS if any(m.scenario == s for m in measured)]
    backends = list(dict.fromkeys(m.backend for m in measured))
    levels = sorted({m.concurrency for m in measured})
    cols = min(2, len(scenarios))
    grid_rows = -(-len(scenarios) // cols)
    colors = plt.get_cmap("tab10")
    written = []
    for name, draw in (("latency", _latency_chart), ("throughput", _throughput_chart)):
        fig, axes = plt.subplots(
            grid_rows, cols, figsize=(6.5 * cols, 4 * grid_rows), squeeze=False
        )
        for ax, scenario in zip(axes.flat, scenarios, strict=False):
            draw(ax, _Chart(scenario, measured, backends, levels, colors))
        for ax in list(axes.flat)[len(scenarios) :]:
            ax.set_visible(False)
        _legend_below(fig, axes.flat[0])
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _latency_chart(ax: Any, chart: _Chart) -> None:
    scenario, measured, backends, levels, colors = chart
    width = 0.8 / max(1, len(levels))
    for li, level in enumerate(levels):
        xs, p50s, p99s, floor_p50s = [], [], [], []
        for bi, backend in enumerate(backends):
            for m in measured:
                if (m.backend, m.scenario, m.concurrency) != (backend, scenario, level):
                    continue
                latency = m.subject.latency_ms()
                if latency["p50"] is None or latency["p99"] is None:
                    continue
                xs.append(bi - 0.4 + width * (li + 0.5))
                p50s.append(latency["p50"])
                p99s.append(latency["p99"] - latency["p50"])
                floor_p50s.append(None if m.floor is None else m.floor.latency_ms()["p50"])
        ax.bar(
            xs,
            p50s,
            width,
            yerr=[[0.0] * len(p99s), p99s],
            capsize=2,
            color=colors(li),
            label=f"{level} worker{'s' if level > 1 else ''}",
        )
        floor_x = [x for x, f in zip(xs, floor_p50s, strict=True) if f is not None]
        floor_y = [f for f in floor_p50s if f is not None]
        ax.scatter(floor_x, floor_y, marker="_", s=120, color="black", zorder=3)
    ax.set_xticks(range(len(backends)), backends)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title(f"{scenario}: p50 (whisker: p99); black tick: floor p50")


def _throughput_chart(ax: Any, chart: _Chart) -> None:
    scenario, measured, backends, levels, colors = chart
    for bi, backend in enumerate(backends):
        points = sorted(
            (m.concurrency, m.subject.ops_per_s, None if m.floor is None else m.floor.ops_per_s)
            for m in measured
            if m.backend == backend and m.scenario == scenario and m.subject.ops_per_s
        )
        if not points:
            continue
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            color=colors(bi),
            label=backend,
        )
        floor = [(p[0], p[2]) for p in points if p[2]]
        if floor:
            ax.plot(
                [p[0] for p in floor],
                [p[1] for p in floor],
                linestyle="--",
                color=colors(bi),
                alpha=0.6,
                label=f"{backend} floor",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.set_yscale("log")
    ax.set_xlabel("concurrent workers")
    ax.set_ylabel("operations/s (log)")
    ax.set_title(f"{scenario}: throughput against concurrency (dashed: floor)")
