"""Errors a user can act on: a reader that left the pipe, a status of a database that is not
there, a migrate hint that can be pasted, and a migration refused for a missing privilege."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from idemstore import SchemaError
from idemstore.backends.migrate import migrate_hint, run_migrations
from idemstore.backends.urls import open_store
from idemstore.cli import main
from idemstore.testing.fixtures.postgres import with_options
from tests.conftest import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# -- a reader that left the pipe --------------------------------------------------------------


@pytest.mark.parametrize("argv", [["stats", "memory://"], ["migrate", "memory://"]])
def test_a_command_whose_reader_left_exits_quietly_with_status_141(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    # The reader leaves before the command starts, so every write it makes meets EPIPE.
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "idemstore", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == 141


# -- a status only reads ---------------------------------------------------------------------


def test_migrate_status_of_a_missing_sqlite_file_says_so_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "missing.db"
    assert main(["migrate", "--status", f"sqlite:///{path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"idemstore: error: the SQLite database {path} does not exist; ")
    assert f"run: idemstore migrate sqlite:///{path} to create it" in err
    assert not path.exists()


def test_migrate_dry_run_of_a_missing_sqlite_file_plans_everything_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "missing.db"
    assert main(["migrate", "--dry-run", f"sqlite:///{path}"]) == 0
    assert "-- 0001_records.sql (pending" in capsys.readouterr().out
    assert not path.exists()


# -- a hint that can be pasted ---------------------------------------------------------------


def test_the_migrate_hint_of_a_url_without_password_is_that_url() -> None:
    hint = migrate_hint("postgresql://app@db:5432/main", password_variable="PGPASSWORD")
    assert hint == "run: idemstore migrate postgresql://app@db:5432/main"


def test_the_migrate_hint_leaves_the_password_out_and_says_where_it_goes() -> None:
    hint = migrate_hint(
        "postgresql://app:s3cret@db:5432/main?schema=orders&sslmode=require",
        password_variable="PGPASSWORD",
    )
    assert hint == (
        "run: idemstore migrate 'postgresql://app@db:5432/main?schema=orders&sslmode=require'"
        " with PGPASSWORD set to the password (not shown here)"
    )


def test_the_hint_of_an_unmigrated_postgres_store_runs_as_pasted(
    postgres_server: str,
    postgres_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = urlsplit(postgres_server)
    # The test server trusts loopback clients: any password gets in, so the hint is runnable.
    with_password = parts._replace(netloc=f"{parts.username}:s3cret@{parts.hostname}:{parts.port}")
    url = with_options(with_password.geturl(), schema=postgres_schema)

    async def refused() -> str:
        async with open_store(url, pool_min_size=0, pool_max_size=1) as store:
            with pytest.raises(SchemaError) as missing:
                await store.get("k")
        return str(missing.value)

    message = asyncio.run(refused())
    assert "s3cret" not in message
    command = re.search(r"run: (idemstore migrate \S+) with PGPASSWORD set to", message)
    assert command is not None, message
    assert "***" not in command.group(1)
    _, _, pasted = shlex.split(command.group(1))
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    assert main(["migrate", pasted]) == 0


# -- a migration refused for a missing privilege -------------------------------------------


async def _admin(dsn: str, *statements: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture
def low_privilege_url(postgres_server: str) -> Iterator[tuple[str, str, str, str]]:
    """A store URL on a fresh database, as a role that may connect but create nothing."""
    suffix = uuid.uuid4().hex[:12]
    role, database = f"idem_low_{suffix}", f"idem_priv_{suffix}"
    asyncio.run(_admin(postgres_server, f"CREATE ROLE {role} LOGIN", f"CREATE DATABASE {database}"))
    parts = urlsplit(postgres_server)
    on_database = parts._replace(path=f"/{database}")
    as_role = on_database._replace(netloc=f"{role}@{parts.hostname}:{parts.port}")
    yield as_role.geturl(), on_database.geturl(), role, database
    asyncio.run(
        _admin(
            postgres_server,
            f"DROP DATABASE IF EXISTS {database} WITH (FORCE)",
            f"DROP ROLE IF EXISTS {role}",
        )
    )


async def test_migrate_without_create_on_the_schema_names_the_grant_that_fixes_it(
    low_privilege_url: tuple[str, str, str, str],
) -> None:
    url, admin_url, role, _ = low_privilege_url
    with pytest.raises(SchemaError) as refused:
        await run_migrations(url, pool_min_size=0, pool_max_size=1)
    message = str(refused.value)
    assert f"needs the CREATE privilege on schema public, which role {role} lacks" in message
    grant = f"GRANT USAGE, CREATE ON SCHEMA public TO {role};"
    assert grant in message
    await _admin(admin_url, grant)
    run = await run_migrations(url, pool_min_size=0, pool_max_size=1)
    assert run.applied


async def test_migrate_that_must_create_its_schema_names_create_on_the_database(
    low_privilege_url: tuple[str, str, str, str],
) -> None:
    url, admin_url, role, database = low_privilege_url
    with pytest.raises(SchemaError) as refused:
        await run_migrations(with_options(url, schema="orders"), pool_min_size=0, pool_max_size=1)
    message = str(refused.value)
    assert f"needs the CREATE privilege on database {database}, which role {role}" in message
    grant = f"GRANT CREATE ON DATABASE {database} TO {role};"
    assert grant in message
    await _admin(admin_url, grant)
    run = await run_migrations(with_options(url, schema="orders"), pool_min_size=0, pool_max_size=1)
    assert run.applied
