"""What the CLI pages show beside the --help texts: the README's synopsis names every command, and
the bench sample in docs/cli.md has the columns bench prints."""

from __future__ import annotations

import argparse
import re

from idemstore.cli import build_parser
from tests.docs.markdown_blocks import ROOT, blocks_of


def cli_commands() -> set[str]:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(commands.choices)


def test_readme_synopsis_names_every_command() -> None:
    (synopsis,) = (
        b
        for b in blocks_of(ROOT / "README.md")
        if b.marker == "not-runnable" and "synopsis" in b.marker_value
    )
    shown = set(re.findall(r"^idemstore ([a-z-]+)", synopsis.source, re.MULTILINE))
    assert shown == cli_commands(), f"README.md:{synopsis.line} shows {sorted(shown)}"


def test_bench_sample_in_cli_docs_has_the_wide_tables_columns() -> None:
    # The sample's numbers are one run's; its columns must be the ones bench prints today.
    from idemstore.bench.report import COLUMNS

    (sample,) = (
        b
        for b in blocks_of(ROOT / "docs" / "cli.md")
        if b.source.startswith("$ idemstore bench ") and "--help" not in b.source.splitlines()[0]
    )
    assert "--wide" in sample.source.splitlines()[0], "the sample is the --wide table"
    header = next(line for line in sample.source.splitlines() if line.startswith("backend"))
    # Column names hold single spaces ("x floor p50"): compare the words in order.
    assert header.split() == " ".join(COLUMNS).split(), (
        f"docs/cli.md:{sample.line}: bench's columns changed; paste a new --wide run there"
    )


def test_bench_options_table_in_cli_docs_lists_every_flag_and_scenario() -> None:
    from idemstore.cli import SCENARIO_NAMES

    (commands,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {
        max(action.option_strings, key=len)
        for action in commands.choices["bench"]._actions
        if action.option_strings and action.dest != "help"
    }
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page[page.index("## `idemstore bench`") : page.index("## `idemstore proxy`")]
    rows = set(re.findall(r"^\| `(--[a-z-]+)", section, re.MULTILINE))
    assert rows == flags, f"docs/cli.md's bench table: {sorted(rows ^ flags)} differ"
    (scenarios,) = re.findall(r"^\| `--scenario NAME …` \| all \| any of (.*?);", section, re.M)
    assert re.findall(r"`([a-z-]+)`", scenarios) == list(SCENARIO_NAMES)
