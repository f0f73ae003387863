"""The examples of the synchronous doors' pages (sync, WSGI, Django, Celery) run as pasted,
each in a fresh interpreter (the Django one configures settings)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

PAGES = ["docs/sync.md", "docs/wsgi.md", "docs/django.md", "docs/celery.md"]


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
        ran = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, f"{page}, block {number + 1}:\n{ran.stderr[-3000:]}"
