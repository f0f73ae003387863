"""Fixtures every test directory shares.

Where each backend's store lives comes from the ``idemstore.testing`` plugin (loaded here
explicitly, in case pytest's plugin autoloading is off): every engine's registry entry names
the module of its fixtures (``<variant>_store_url`` and the servers behind them), each giving
a fresh, empty, migrated store per test. A missing server skips that backend loudly, or fails
the run when IDEMSTORE_TEST_REQUIRE_ALL=1 (``backend_unavailable``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from idemstore.local_servers.postgres import start_postgres
from idemstore.testing.fixtures import backend_unavailable, require_driver, run_sync, running
from idemstore.testing.fixtures.postgres import migrate_schema, new_schema, with_options

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins: list[str] = ["idemstore.testing"]

__all__ = [
    "ROOT",
    "backend_unavailable",
    "built_wheel",
    "make_venv",
    "output_of",
    "quiet_postgres_store_url",
]


@pytest.fixture
def quiet_postgres_store_url() -> Iterator[str]:
    """A fresh, migrated store on a PostgreSQL server of its own, for tests that read
    server-wide counters such as the WAL position. On the session's server CI once read
    -31,574 WAL bytes per new call: something else (likely autovacuum of earlier tests'
    tables) wrote during a phase the cost scenario subtracts."""
    require_driver("postgres", "asyncpg", "postgres")
    with running("postgres", start_postgres) as server:
        url = with_options(server.url, schema=new_schema())
        run_sync(lambda: migrate_schema(url))
        yield url


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
    )
    (wheel,) = out.glob("idemstore-*.whl")
    return wheel


def make_venv(where: Path, *requirements: str) -> Path:
    """A fresh virtualenv at ``where`` with ``requirements`` pip-installed; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    bin_dir = where / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "-q", *requirements], check=True)
    return bin_dir


def output_of(*argv: str | Path, cwd: Path, timeout: float | None = None) -> str:
    """What ``argv`` printed, run in ``cwd``; the test fails, showing its output, unless it
    exits 0."""
    done = subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
async def silent_endpoint() -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A loopback port that accepts connections and never answers, and what it accepted."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], accepted
    for writer in accepted:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Registrations a test makes are undone afterwards."""
    from idemstore.backends import registry

    engines, schemes = dict(registry._ENGINES), dict(registry._SCHEMES)
    yield
    registry._ENGINES.clear()
    registry._ENGINES.update(engines)
    registry._SCHEMES.clear()
    registry._SCHEMES.update(schemes)
