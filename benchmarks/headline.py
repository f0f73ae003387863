"""Write the README's benchmark headline from a committed ``idemstore bench`` run.

    python benchmarks/headline.py            # rewrite README.md between the bench markers
    python benchmarks/headline.py --check    # exit 1 if README.md is not what this would write

The numbers are never typed by hand: they come from ``benchmarks/local/results.json``, the
output of ``idemstore bench --local --out benchmarks/local``. A test runs ``--check``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from idemstore.backends.registry import engines

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "local" / "results.json"
README = ROOT / "README.md"
START = "<!-- bench:start (written by benchmarks/headline.py; do not edit) -->"
END = "<!-- bench:end -->"
# One row per registered engine, in registry order; an engine the run lacks has no row.
BACKENDS = tuple(engine.name for engine in engines())


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 10 else f"{value:,.0f}"


def headline(results: dict[str, object]) -> str:
    rows = results["results"]
    assert isinstance(rows, list)
    meta = results["meta"]
    assert isinstance(meta, dict)

    def find(backend: str, scenario: str, concurrency: int) -> dict[str, object] | None:
        for row in rows:
            if (row["backend"], row["scenario"], row["concurrency"]) == (
                backend,
                scenario,
                concurrency,
            ):
                return row  # type: ignore[no-any-return]
        return None

    top = max(r["concurrency"] for r in rows if r["scenario"] == "fresh")
    lines = [
        f"p50 in ms of `reserve` on new keys (`reserve`), `reserve`+`complete` on new keys "
        f"(`fresh`) and `reserve` on completed keys (`replay`), each with its ratio to the "
        f"engine's raw-driver floor in the same run (one bare insert; for `fresh` an insert and "
        f"an update); {meta['cpus']} CPUs ({meta['machine']}), {meta['started_at'][:10]}:",
        "",
        f"| backend | reserve p50 | x floor | fresh p50 | x floor | fresh ops/s, {top} workers "
        "| replay p50 | x floor | exactly once |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for backend in BACKENDS:
        claim, fresh, busy, replay = (
            find(backend, "reserve", 1),
            find(backend, "fresh", 1),
            find(backend, "fresh", top),
            find(backend, "replay", 1),
        )
        if claim is None or fresh is None or busy is None or replay is None:
            continue
        # None: a measurement where executions mean nothing (a wake-up probe).
        once = all(r.get("exactly_once") is not False for r in rows if r["backend"] == backend)
        cells = [backend]
        for row in (claim, fresh):
            cells += [_fmt(row["latency_ms"]["p50"]), f"{row['ratio_p50']:.2f}"]  # type: ignore[index]
        cells += [
            _fmt(busy["ops_per_s"]),  # type: ignore[arg-type]
            _fmt(replay["latency_ms"]["p50"]),  # type: ignore[index]
            f"{replay['ratio_p50']:.2f}",
            "yes" if once else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Full tables and charts: [benchmarks/local/results.md](benchmarks/local/results.md).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args()
    block = headline(json.loads(RESULTS.read_text()))
    text = README.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    if not rest:
        print(f"README.md has no {START!r} marker", file=sys.stderr)
        return 1
    wanted = f"{before}{START}\n{block}\n{END}{after}"
    if args.check:
        if wanted != text:
            print(
                "README.md's benchmark headline differs from benchmarks/local/results.json:"
                " run python benchmarks/headline.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
