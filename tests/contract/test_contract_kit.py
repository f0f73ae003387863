"""The contract suite as a kit: a backend joins it with one registration, and a project outside
this repository runs it with one line of pytest configuration.

Each run happens in a pytest subprocess started from an empty temporary directory, so nothing
of this repository's configuration (its asyncio mode, its testpaths, its conftest) helps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT, make_venv

if TYPE_CHECKING:
    from pathlib import Path

SIXTH = "tests.contract.sixth_backend"


def contract_tests() -> set[str]:
    """The contract suite's test functions, by name, read from its modules."""
    names: set[str] = set()
    for module in (ROOT / "idemstore" / "testing" / "contract").glob("test_*.py"):
        names |= set(re.findall(r"^(?:async )?def (test_\w+)\(", module.read_text(), re.M))
    return names


def outcome(output: str) -> dict[str, int]:
    """pytest's last summary line as counts: ``{"passed": 79, "failed": 0, ...}``."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    assert lines, output[-3000:]
    counts = {"passed": 0, "failed": 0, "error": 0, "errors": 0, "skipped": 0}
    for number, word in re.findall(r"(\d+) (\w+)", lines[-1]):
        counts[word] = int(number)
    return counts


def run_python(
    python: str, *args: str, cwd: Path, pythonpath: str | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in ``cwd``, importing from ``pythonpath`` only (not from this session's
    PYTHONPATH) and without this session's PYTEST_ADDOPTS."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [python, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_pytest(
    python: str, *args: str, cwd: Path, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    return run_python(
        python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-rA",
        *args,
        cwd=cwd,
        pythonpath=pythonpath,
    )


def passed_ids(output: str) -> list[str]:
    return re.findall(r"^PASSED (\S+)", output, re.M)


def assert_every_contract_test_passed(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The pytest run passed every test function of the contract suite (more than 50 test
    ids) and failed, errored or skipped none; returns the ids that passed."""
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    counts = outcome(done.stdout)
    assert counts["failed"] == counts["error"] == counts["errors"] == counts["skipped"] == 0
    ran = passed_ids(done.stdout)
    assert len(ran) == counts["passed"] > 50
    assert {re.sub(r"\[.*", "", i).rsplit("::", 1)[-1] for i in ran} == contract_tests()
    return ran


def run_contract_suite(plugin: str, *variants: str, cwd: Path) -> list[str]:
    """The whole contract suite run by pytest in ``cwd`` on each of ``variants``, with
    ``plugin`` (the module that registers them) loaded from this checkout; every test must
    pass. Returns the ids that passed."""
    chosen = [option for variant in variants for option in ("--idemstore-contract", variant)]
    done = run_pytest(sys.executable, "-p", plugin, *chosen, cwd=cwd, pythonpath=str(ROOT))
    return assert_every_contract_test_passed(done)


@pytest.mark.slow
def test_a_sixth_backend_registered_in_its_own_module_passes_the_whole_contract_suite(
    tmp_path: Path,
) -> None:
    # Loading the module is its one registration; the variant id selects it.
    # Every test of the suite ran, each on the sixth backend.
    ran = run_contract_suite(SIXTH, "snapshot", cwd=tmp_path)
    assert all("[snapshot" in test_id for test_id in ran), ran[:5]


@pytest.mark.slow
def test_the_registry_gives_the_sixth_backend_urls_a_schema_and_a_bench_name(
    tmp_path: Path,
) -> None:
    # What else the one registration buys, checked in a fresh interpreter so this session's
    # registry stays as it is.
    script = textwrap.dedent(
        f"""
        import asyncio
        import {SIXTH} as sixth
        from idemstore import open_store
        from idemstore.bench.floors import floor_for_url
        from idemstore.bench.runner import name_targets
        from idemstore.backends.registry import known_schemes
        from idemstore.backends.schema import run_schema

        assert "snapshot" in known_schemes()
        assert type(open_store("snapshot://")) is sixth.SnapshotStore
        report = asyncio.run(run_schema("snapshot://", "status"))
        print(report.render())
        assert floor_for_url("snapshot://") is None
        assert [t.name for t in name_targets(["snapshot://", "snapshot://"])] == [
            "snapshot", "snapshot-2"]
        """
    )
    done = run_python(sys.executable, "-c", script, cwd=tmp_path, pythonpath=str(ROOT))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "snapshot:// stores keep no schema: nothing to migrate\n"


FACTORY_MODULE = """
from idemstore import open_store


async def new_store():
    return open_store("sqlite:///:memory:")
"""


@pytest.mark.slow
def test_a_project_outside_the_checkout_runs_the_suite_with_one_line_of_configuration(
    built_wheel: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"  # no idemstore source anywhere near: only the wheel
    project.mkdir()
    # The usual layout: the virtualenv inside the project, where pytest does not look for tests.
    venv = project / ".venv"
    bin_dir = make_venv(venv, f"{built_wheel}[sqlite,testing]")
    # The one line: a store URL; {tmp_path} gives each test a database of its own.
    (project / "pytest.ini").write_text(
        "[pytest]\nidemstore_contract = sqlite:///{tmp_path}/contract.db\n"
    )
    python = str(bin_dir / "python")
    done = run_pytest(python, cwd=project)
    ran = assert_every_contract_test_passed(done)
    # The suite came from the installed package, not from this checkout.
    located = run_python(
        python, "-c", "import idemstore.testing as t; print(t.CONTRACT_DIR)", cwd=project
    )
    assert located.returncode == 0, located.stderr
    assert located.stdout.strip().startswith(str(venv)), located.stdout

    # A factory instead of a URL: the same one line, on the command line this time.
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "factory_store.py").write_text(FACTORY_MODULE)
    by_factory = run_pytest(python, "--idemstore-contract", "factory_store:new_store", cwd=project)
    assert by_factory.returncode == 0, by_factory.stdout[-5000:] + by_factory.stderr[-2000:]
    assert outcome(by_factory.stdout)["passed"] == len(ran)
    assert all("[new_store" in test_id for test_id in passed_ids(by_factory.stdout))


# pytest with pytest-asyncio hidden (its plugin blocked, its module not found), as in a project
# that has idemstore but not its testing extra: our plugin is still loaded by its entry point.
WITHOUT_PYTEST_ASYNCIO = """
import importlib.abc
import importlib.util
import sys


class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pytest_asyncio":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hidden())
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "pytest_asyncio" else real(name, *a)
import pytest
sys.exit(pytest.main(["-p", "no:cacheprovider", "-p", "no:asyncio", *sys.argv[1:]]))
"""


def test_the_plugin_leaves_a_project_without_pytest_asyncio_alone(tmp_path: Path) -> None:
    (tmp_path / "test_theirs.py").write_text("def test_theirs():\n    assert True\n")

    def pytest_without_asyncio(*args: str) -> subprocess.CompletedProcess[str]:
        return run_python(sys.executable, "-c", WITHOUT_PYTEST_ASYNCIO, *args, cwd=tmp_path)

    theirs = pytest_without_asyncio("-q")
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert "1 passed" in theirs.stdout
    # Asking for the suite without what runs it is a usage error that names the fix.
    asked = pytest_without_asyncio("-q", "--idemstore-contract", "memory://")
    assert asked.returncode == 4, asked.stdout + asked.stderr
    assert "pip install '.[testing]' (in idemstore's checkout)" in asked.stderr
