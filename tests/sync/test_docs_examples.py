"""The examples of docs/sync.md and docs/wsgi.md run as pasted."""

from __future__ import annotations

import re
import runpy
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

PAGES = ["docs/sync.md", "docs/wsgi.md"]


def python_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page: str, tmp_path: Path) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    for number, block in enumerate(blocks):
        script = tmp_path / f"example_{number}.py"
        script.write_text(block, encoding="utf-8")
        runpy.run_path(str(script), run_name="__main__")
