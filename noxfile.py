"""The test lanes: which tests run on which Python (README, "Development").

``./scripts/test`` runs every session here after ruff and the docs build. Run one lane alone
with ``nox -s fast-3.13`` or ``nox -s slow``; arguments after ``--`` go to pytest.

Lane selection is defined once, below: the *slow* lane is every test under ``SLOW_PATHS`` plus
every test marked ``SLOW_MARKER`` anywhere else; the *fast* lane is everything else. Each test
runs in exactly one lane on ``SLOW_LANE_PYTHON``, and the fast lane runs on every Python in
``PYTHONS`` (the package's classifiers must list the same ones: tests/test_packaging.py checks).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nox
import nox.command

# The Pythons the package claims (requires-python and the classifiers in pyproject.toml).
PYTHONS = ["3.11", "3.12", "3.13"]
# The engine-heavy lane runs on one of them: the machines' default Python (.venv uses it too).
SLOW_LANE_PYTHON = "3.11"
# Whole directories or files that belong to the slow lane: reliability (fault injection, killed
# processes, engine restarts), process races, and the MCP/HTTP integration suites that spawn
# servers and clients. Paths are relative to the project root; a moved suite is changed here.
SLOW_PATHS = [
    "tests/reliability",
    "tests/test_process_race.py",
    "tests/mcp",
    "tests/mcp_server",
    "tests/http",
    "tests/gateway",
]
# The SEP-2663 tasks lane: tests that need fastmcp-tasks, which pins an older fastmcp-slim than
# the [mcp] extra's FastMCP. It runs in an environment of its own (``tasks`` below) and in no
# other lane, so installing it never downgrades the FastMCP the other lanes test.
TASKS_PATHS = ["tests/tasks"]
# fastmcp-tasks installed without its fastmcp-slim pin (checked against FastMCP 4.2: the lane
# fails if it stops working), and the dependencies it brings besides that pin.
TASKS_PACKAGES = ["fastmcp-tasks==4.1.4"]
TASKS_DEPENDENCIES = ["pydocket>=0.26.1", "cryptography>=43.0.0"]
# Tests elsewhere that install packages, race processes or restart engines carry this marker
# (declared in pyproject.toml's [tool.pytest.ini_options]).
SLOW_MARKER = "slow"
# The slow lane's tests mostly wait (on spawned servers, leases, restarts), so two pytest-xdist
# workers share it; each test file stays on one worker (loadfile), so a file's own engines and
# processes are never raced by its own tests.
SLOW_LANE_WORKERS = ["-n", "2", "--dist", "loadfile"]
# What a lane installs (editable: the tests import the checkout anyway, pythonpath = ".");
# docs: tests/docs/test_rendered_site.py builds the site, with the toolchain pinned.
TEST_EXTRAS = ".[all,test,docs]"
DOCS_CONSTRAINTS = "docs-constraints.txt"

# uv makes the four environments quick to build; plain virtualenv (nox's own) still works.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
# Only interpreters already on this machine: a missing one is an error, never a download.
nox.options.download_python = "never"
nox.options.sessions = ["fast", "slow", "tasks", "dist"]
nox.needs_version = ">=2024.10.9"

# pytest exits 5 when it collected or selected nothing: a lane that ran no test proves nothing.
_PYTEST = (
    "import sys, pytest\n"
    "code = pytest.main(sys.argv[1:])\n"
    "if code == 5:\n"
    "    sys.exit('pytest ran no tests in this lane: that is a failure')\n"
    "sys.exit(code)\n"
)


def _pytest(session: nox.Session, *args: str) -> None:
    session.run(
        "python",
        "-c",
        _PYTEST,
        "--durations=15",  # where a lane's time goes, for whoever moves tests between lanes
        *args,
        *session.posargs,
        env={"IDEMSTORE_TEST_REQUIRE_ALL": "1"},
    )


def _install_for_tests(session: nox.Session) -> None:
    # pip too: uv's virtualenvs come without it, and tests build the wheel with `python -m pip`.
    _install(session, "pip", *_rebuilt_here(session), "-c", DOCS_CONSTRAINTS, "-e", TEST_EXTRAS)


def _rebuilt_here(session: nox.Session) -> list[str]:
    """uv's flags that build the editable install again in this lane. Its build compiles the
    hasher's extension for this Python beside the sources (hatch_build.py), but an editable
    wheel is tagged py3-none-any, so uv would reuse another lane's from its cache and this
    Python would run without the extension (the lanes require it). The refresh alone is not
    enough for lanes that start together: one builds while the others wait on uv's cache lock,
    then take its wheel as fresh. So each Python also gets a cache key of its own
    (IDEMSTORE_BUILD_FOR, set by _install)."""
    return ["--reinstall-package", "idemstore"] if session.venv_backend == "uv" else []


def _install(session: nox.Session, *requirements: str) -> None:
    # uv writes no bytecode unless asked; with PYTHONDONTWRITEBYTECODE set (as on CI machines)
    # nothing would cache it either, and every Python subprocess a test starts would compile
    # redis-py, boto and the rest again (seconds each: enough to break timing-based tests).
    # IDEMSTORE_BUILD_FOR is one of uv's cache keys for idemstore (pyproject.toml): see
    # _rebuilt_here.
    env = {"UV_COMPILE_BYTECODE": "1", "IDEMSTORE_BUILD_FOR": str(session.python)}
    session.install(*requirements, env=env)


# The fast lanes wait on engines far more than they compute (a lane uses a fraction of a core),
# so scripts/test runs them side by side (nox -j); the slow lane times races, kills processes
# and restarts engines, so it runs after them (on its own two workers: SLOW_LANE_WORKERS).
@nox.session(python=PYTHONS, allow_parallel=True)
def fast(session: nox.Session) -> None:
    """Types and the unit and contract tests, on every supported Python."""
    _install_for_tests(session)
    # The interpreter's own version, so stdlib and dependency stubs are those of this Python.
    session.run("mypy", "--strict", "--python-version", session.python, "idemstore")
    ignore = [f"--ignore={path}" for path in [*SLOW_PATHS, *TASKS_PATHS]]
    _pytest(session, "-m", f"not {SLOW_MARKER}", *ignore)


@nox.session(python=SLOW_LANE_PYTHON, allow_parallel=False)
def slow(session: nox.Session) -> None:
    """Reliability, process races, installs and the MCP/HTTP integration suites, on one Python."""
    _install_for_tests(session)
    ignore = [f"--ignore={path}" for path in [*SLOW_PATHS, *TASKS_PATHS]]
    # Two pytest runs (markers cannot select by path); the second runs even when the first
    # failed, so one lane run reports every failure. Either failing fails the lane.
    failed = []
    for args in ([*SLOW_PATHS], ["-m", SLOW_MARKER, *ignore]):
        try:
            _pytest(session, *SLOW_LANE_WORKERS, *args)
        except nox.command.CommandFailed:
            failed.append(" ".join(args))
    if failed:
        session.error(f"slow lane failed in: {'; '.join(failed)}")


# Small and light (a few spawned servers): it runs beside the fast lanes, adding no wall time.
@nox.session(python=SLOW_LANE_PYTHON, allow_parallel=True)
def tasks(session: nox.Session) -> None:
    """SEP-2663 tasks through the proxy, the gateway and the server adapters (fastmcp-tasks)."""
    _install(
        session,
        "pip",
        *_rebuilt_here(session),
        "-e",
        ".[mcp,gateway,test]",
        *TASKS_DEPENDENCIES,
    )
    _install(session, "--no-deps", *TASKS_PACKAGES)
    _pytest(session, *TASKS_PATHS)


@nox.session(python=SLOW_LANE_PYTHON, allow_parallel=True)
def dist(session: nox.Session) -> None:
    """Build the sdist and, from it, the wheel; check both the way an index would."""
    _install(session, "build[uv]", "twine")
    out = Path("dist")
    shutil.rmtree(out, ignore_errors=True)
    # The sdist first, then the wheel from the unpacked sdist (build's default): a file the
    # sdist forgets breaks the wheel here, not on a user's machine.
    session.run("python", "-m", "build", "--installer=uv", "--outdir", str(out))
    built = sorted(str(p) for p in out.iterdir())
    if not any(p.endswith(".tar.gz") for p in built) or not any(p.endswith(".whl") for p in built):
        session.error(f"python -m build did not produce an sdist and a wheel: {built}")
    session.run("twine", "check", "--strict", *built)
