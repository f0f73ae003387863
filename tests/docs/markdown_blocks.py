"""The fenced code blocks of the docs pages, each with the marker comment written before it.

A block is either run by the docs tests or says why not, in an HTML comment on the line just
before its fence (mkdocs does not render it):

- ``<!-- not-runnable: REASON -->``: IAM JSON, a load balancer's config, an output sample...;
  the reason is required.
- ``<!-- tested-by: tests/PATH.py -->``: a test elsewhere runs this block (it needs servers or
  clients this harness does not start); the file must exist and read the page.
- ``<!-- example: NAME -->``: the same, for docs/mcp-server.md's examples, which
  tests/mcp_server/test_docs_example.py finds by this name.
- ``<!-- output -->``: what the Python block before prints; compared with what it printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>[\w-]+)\s*:?\s*(?P<value>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the project root, e.g. "docs/cli.md"
    line: int  # of the opening fence, 1-based
    lang: str
    source: str  # dedented by the fence's own indentation
    marker: str  # "" when there is none
    marker_value: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    name = page.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(
            Block(
                page=name,
                line=i + 1,
                lang=opening["lang"].lower(),
                source="\n".join(body) + "\n",
                marker=marker["kind"] if marker else "",
                marker_value=marker["value"] if marker else "",
            )
        )
        i = end + 1
    return found
