"""The README's first screen stays true."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_readme_benchmark_headline_is_the_committed_run() -> None:
    # The numbers are written by benchmarks/headline.py from benchmarks/local/results.json,
    # never typed by hand.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "headline.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_readme_names_the_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in readme.split("```python")[0]
    assert "exec ./scripts/test" in ci
