"""Fixtures every test directory shares: where each backend's store lives.

Each backend provides a function-scoped fixture ``<backend>_store_url`` that yields the URL of
a fresh, empty, migrated store (its own file, schema, key prefix or table), so tests never see
each other's records. Backends whose engine is a server start it once per session from the
binaries on PATH (``idemstore.local_servers``); a missing server skips that backend loudly, or
fails the run when IDEMSTORE_TEST_REQUIRE_ALL=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins: list[str] = [
    "tests.fixtures.dynamodb",
    "tests.fixtures.postgres",
    "tests.fixtures.redis",
    "tests.fixtures.sqlite",
]


def backend_unavailable(backend: str, why: str) -> NoReturn:
    """Skip (on a laptop) or fail (in CI) a test whose backend cannot run here."""
    message = f"{backend} backend unavailable: {why}"
    if os.environ.get("IDEMSTORE_TEST_REQUIRE_ALL") == "1":
        pytest.fail(message + " (IDEMSTORE_TEST_REQUIRE_ALL=1 forbids skipping)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def memory_store_url() -> str:
    return "memory://"


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
