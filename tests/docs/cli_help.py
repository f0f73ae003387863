"""The ``--help`` texts the docs show, against the parser's own at 80 columns.

A console block whose first line is ``$ idemstore [COMMAND] --help`` shows the start of that
help: its lines must be the first lines of what ``idemstore.cli.build_parser()`` prints (a page
may stop after the usage and the description, and list the options in a table). After a change
to the CLI's flags, rewrite every such block from the parser:

    PYTHONPATH=. python -m tests.docs.cli_help --write
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from unittest import mock

from idemstore.cli import build_parser
from tests.docs.markdown_blocks import ROOT, Block, blocks_of, doc_pages

_HELP_LINE = re.compile(r"^\$ idemstore(?P<command>(?: [a-z-]+)?) --help$")
WIDTH = "80"


def help_command(block: Block) -> str | None:
    """The subcommand ("" for the top level) whose help the block shows, or None."""
    if block.lang != "console":
        return None
    first = block.source.splitlines()[0] if block.source.strip() else ""
    found = _HELP_LINE.match(first)
    return found["command"].strip() if found else None


def real_help(command: str) -> str:
    """What ``idemstore [COMMAND] --help`` prints on an 80-column terminal."""
    argv = [command, "--help"] if command else ["--help"]
    out = io.StringIO()
    with (
        mock.patch.dict(os.environ, {"COLUMNS": WIDTH, "LINES": "24"}),
        contextlib.redirect_stdout(out),
        contextlib.suppress(SystemExit),
    ):
        build_parser().parse_args(argv)
    return out.getvalue()


def comparable(lines: list[str]) -> list[str]:
    """``lines`` with the usage paragraph as one line of single spaces. Where argparse breaks
    a usage line differs between Pythons (3.13 keeps a mutually exclusive group whole); what
    the usage says does not, and that is what the page must get right."""
    if not lines or not lines[0].startswith("usage:"):
        return lines
    end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    return [" ".join(" ".join(lines[:end]).split()), *lines[end:]]


def shown_lines(block: Block) -> list[str]:
    """The help the block shows, its usage as one line (``comparable``)."""
    return comparable(block.source.rstrip("\n").splitlines()[1:])


def expected_lines(block: Block, command: str) -> list[str]:
    """The real help, its usage as one line, cut to as many lines as the block shows."""
    real = comparable(real_help(command).rstrip("\n").splitlines())
    return real[: len(shown_lines(block))]


def rewrite_page(text: str, blocks: list[Block]) -> str:
    """The page with each help block's text replaced by the parser's, cut where the page cut
    it: at the end of the paragraph it stopped in, or the whole help."""
    lines = text.splitlines(keepends=True)
    for block in sorted(blocks, key=lambda b: b.line, reverse=True):
        command = help_command(block)
        if command is None:
            continue
        real = real_help(command).rstrip("\n").splitlines()
        shown = len(block.source.rstrip("\n").splitlines()[1:])  # as written, usage unjoined
        if shown < len(real):
            # keep the page's cut: up to the end of the paragraph the shown text ended in
            cut = shown
            while cut < len(real) and real[cut - 1].strip():
                cut += 1
            real = real[:cut]
            while real and not real[-1].strip():
                real.pop()
        start = block.line  # the index after the fence line (block.line is 1-based)
        first = start  # the "$ idemstore ... --help" line
        end = first + 1 + shown
        lines[first + 1 : end] = [line + "\n" for line in real]
    return "".join(lines)


def main() -> None:
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    for page in doc_pages():
        text = page.read_text()
        new = rewrite_page(text, blocks_of(page))
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
