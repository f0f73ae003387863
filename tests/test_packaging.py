"""The package works without any extra installed, and says what to install for the rest."""

from __future__ import annotations

import subprocess
import textwrap
from typing import TYPE_CHECKING

import pytest

from tests.conftest import make_venv

if TYPE_CHECKING:
    from pathlib import Path

CORE_CHECK = textwrap.dedent(
    """
    import asyncio, importlib.util
    from idemstore import Idempotency, MissingDependencyError, fingerprint, open_store

    for driver in ("aiosqlite", "asyncpg", "redis", "aiobotocore"):
        assert importlib.util.find_spec(driver) is None, driver

    async def main():
        async with open_store("memory://") as store:
            idem = Idempotency(store)
            calls = []
            async def work():
                calls.append(1)
                return b"ok"
            fp = fingerprint({"a": 1})
            await idem.run("k", fp, work)
            replay = await idem.run("k", fp, work)
            assert replay.replayed and len(calls) == 1
        try:
            open_store("redis://127.0.0.1:6379")
        except MissingDependencyError as exc:
            print(exc)
        else:
            raise SystemExit("redis:// did not raise MissingDependencyError")

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_core_install_works_without_extras(built_wheel: Path, tmp_path: Path) -> None:
    bin_dir = make_venv(tmp_path / "venv", str(built_wheel))
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", CORE_CHECK],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'idemstore[redis]'" in done.stdout
    help_text = subprocess.run(
        [str(bin_dir / "idemstore"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "inspect" in help_text
