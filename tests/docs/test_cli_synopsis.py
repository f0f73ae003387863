"""The README's command-line synopsis names every command the CLI has."""

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
