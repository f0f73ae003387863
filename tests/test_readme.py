"""The README's first screen stays true."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.conftest import ROOT

README = ROOT / "README.md"


def quickstart_source() -> str:
    """The README's Python example (its first ```python block), as a user would paste it."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    assert blocks, "README.md has no ```python block"
    return str(blocks[0])


def assert_quickstart_output(stdout: str) -> None:
    """The quickstart charged once and replayed the two retries under the same fence."""
    lines = stdout.splitlines()
    assert sum(line.startswith("charging") for line in lines) == 1, stdout
    results = [line for line in lines if not line.startswith("charging")]
    assert len(results) == 3, stdout
    assert results[0].endswith("ran fence 1"), stdout
    assert all(line.endswith("replayed fence 1") for line in results[1:]), stdout


def noxfile_constant(name: str) -> object:
    """A literal assigned at the top of noxfile.py (read, not imported: no nox needed)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py assigns no {name}")


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
    readme = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in readme.split("```python")[0]
    assert "exec ./scripts/test" in ci


def test_readme_quickstart_charges_once_and_replays_the_retries() -> None:
    done = subprocess.run(
        [sys.executable, "-c", quickstart_source()],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert_quickstart_output(done.stdout)


def test_readme_says_which_lane_runs_on_which_python() -> None:
    # The Development section's lane table: one row per nox session, its Pythons in a cell.
    development = README.read_text().split("## Development", 1)[1]
    rows = [line for line in development.splitlines() if line.startswith("| `")]
    pythons = noxfile_constant("PYTHONS")
    slow_python = noxfile_constant("SLOW_LANE_PYTHON")
    assert isinstance(pythons, list) and isinstance(slow_python, str)
    fast = [row for row in rows if row.startswith("| `fast")]
    slow = [row for row in rows if row.startswith("| `slow")]
    assert len(fast) == 1 and len(slow) == 1, "README's lane table has no fast and slow row"
    for python in pythons:
        assert f"`fast-{python}`" in fast[0], f"README's fast lane does not name {python}"
    assert f"| {slow_python} |" in slow[0], f"README's slow lane does not name {slow_python}"
