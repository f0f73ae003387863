"""Schema migrations: file naming, history checks, the runner, ``idemstore migrate``, and the
migrations shipped inside the wheel."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import zipfile
from typing import TYPE_CHECKING

import pytest

from idemstore import SchemaError
from idemstore.backends.migrate import (
    MIGRATION_NAME,
    SCHEMA_FILE,
    AppliedMigration,
    Migration,
    load_migrations,
    migration_engine,
    pending_migrations,
    run_migrations,
)
from idemstore.cli import main
from tests.conftest import ROOT, make_venv

if TYPE_CHECKING:
    from pathlib import Path

MIGRATIONS = ROOT / "migrations"


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


# -- the files ---------------------------------------------------------------------------------


def test_every_migration_file_is_named_nnnn_description_sql() -> None:
    engines = [folder for folder in MIGRATIONS.iterdir() if folder.is_dir()]
    assert engines, "no migrations/<engine>/ folders"
    for folder in engines:
        # Beside the migrations, each engine keeps its live schema (tests/test_schema_file.py).
        assert (folder / SCHEMA_FILE).is_file(), f"{folder.name}/{SCHEMA_FILE} is missing"
        names = sorted(path.name for path in folder.iterdir() if path.name != SCHEMA_FILE)
        assert names, f"{folder} is empty"
        for name in names:
            assert MIGRATION_NAME.match(name), f"{folder.name}/{name} is not NNNN_description.sql"
        # Numbered 0001, 0002, ... without gaps or repeats, so the order is never a guess.
        assert [int(name[:4]) for name in names] == list(range(1, len(names) + 1)), folder


def test_sqlite_migrations_load_in_version_order() -> None:
    migrations = load_migrations("sqlite")
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert all(len(m.checksum) == 64 for m in migrations)


def fake_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *names: str) -> None:
    folder = tmp_path / "sqlite"
    folder.mkdir()
    for name in names:
        (folder / name).write_text("SELECT 1;\n")
    monkeypatch.setattr("idemstore.backends.migrate._migrations_root", lambda: tmp_path)


def test_the_runner_never_applies_the_schema_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_root(monkeypatch, tmp_path, "0001_ok.sql", SCHEMA_FILE)
    assert [m.name for m in load_migrations("sqlite")] == ["0001_ok.sql"]


def test_a_badly_named_migration_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_root(monkeypatch, tmp_path, "0001_ok.sql", "2_Bad-Name.sql")
    with pytest.raises(SchemaError, match=r"NNNN_description\.sql"):
        load_migrations("sqlite")


def test_two_migrations_with_one_number_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_root(monkeypatch, tmp_path, "0001_one.sql", "0001_other.sql")
    with pytest.raises(SchemaError, match="share version 0001"):
        load_migrations("sqlite")


def test_an_engine_without_migrations_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="no migrations"):
        load_migrations("no-such-engine")


def test_urls_map_to_their_migrations_folder() -> None:
    assert migration_engine("sqlite:///x.db") == "sqlite"
    assert migration_engine("postgresql://u@h/db") == "postgres"
    assert migration_engine("postgres://u@h/db") == "postgres"
    assert migration_engine("memory://") is None


# -- history checks ------------------------------------------------------------------------------

FIRST = Migration("0001_first.sql", "SELECT 1;", "a" * 64)
SECOND = Migration("0002_second.sql", "SELECT 2;", "b" * 64)


def test_pending_migrations_are_those_not_yet_applied_in_order() -> None:
    applied = [AppliedMigration(FIRST.name, FIRST.checksum, 1.0)]
    assert pending_migrations([FIRST, SECOND], applied) == [SECOND]
    assert pending_migrations([FIRST, SECOND], []) == [FIRST, SECOND]


def test_an_applied_migration_whose_file_changed_is_an_error() -> None:
    applied = [AppliedMigration(FIRST.name, "c" * 64, 1.0)]
    with pytest.raises(SchemaError, match="changed after it was applied"):
        pending_migrations([FIRST, SECOND], applied)


def test_an_applied_migration_this_version_does_not_know_is_an_error() -> None:
    applied = [AppliedMigration("0003_newer.sql", "d" * 64, 1.0)]
    with pytest.raises(SchemaError, match="upgrade idemstore"):
        pending_migrations([FIRST, SECOND], applied)


# -- the runner ----------------------------------------------------------------------------------


async def test_a_second_run_applies_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    first = await run_migrations(url)
    second = await run_migrations(url)
    names = [m.name for m in load_migrations("sqlite")]
    assert [m.name for m in first.applied] == names
    assert second.applied == ()
    assert [s.name for s in second.states] == names
    assert second.pending == []


async def test_status_and_dry_run_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    url = f"sqlite:///{path}"
    status = await run_migrations(url, status=True)
    dry = await run_migrations(url, dry_run=True)
    assert tables(path) == set()
    assert [s.name for s in status.pending] == [m.name for m in load_migrations("sqlite")]
    assert [m.name for m, _ in dry.planned] == [s.name for s in status.pending]
    assert all("CREATE TABLE idemstore_records" in sql for m, sql in dry.planned if m.version == 1)


async def test_a_store_without_a_schema_has_nothing_to_migrate() -> None:
    run = await run_migrations("memory://")
    assert run.engine is None and run.applied == () and run.states == ()


async def test_a_changed_migration_stops_the_runner(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    await run_migrations(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE idemstore_migrations SET checksum = 'edited'")
    with pytest.raises(SchemaError, match="changed after it was applied"):
        await run_migrations(f"sqlite:///{path}")


# -- idemstore migrate -------------------------------------------------------------------------


def test_migrate_applies_then_says_there_is_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    assert main(["migrate", url]) == 0
    assert "applied 0001_records.sql" in capsys.readouterr().out
    assert main(["migrate", url]) == 0
    assert "nothing to apply" in capsys.readouterr().out
    assert "idemstore_records" in tables(tmp_path / "idem.db")


def test_migrate_status_lists_checksums_and_pending_then_applied_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    sqlite3.connect(tmp_path / "idem.db").close()  # --status reads an existing database only
    first = load_migrations("sqlite")[0]
    assert main(["migrate", url, "--status"]) == 0
    before = capsys.readouterr().out
    # Names are padded to the longest one: any run of spaces separates the columns.
    assert re.search(rf"{first.name} +sha256:{first.checksum}  pending", before)
    assert main(["migrate", url]) == 0
    capsys.readouterr()
    assert main(["migrate", url, "--status"]) == 0
    after = capsys.readouterr().out
    assert re.search(rf"{first.name} +sha256:{first.checksum}  applied 20", after)
    assert "0 pending" in after


def test_migrate_dry_run_prints_the_sql_and_applies_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "idem.db"
    assert main(["migrate", f"sqlite:///{path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("-- 0001_records.sql (pending, sha256:")
    assert "BEGIN IMMEDIATE;" in out and "CREATE TABLE idemstore_records" in out
    assert "COMMIT;" in out
    assert tables(path) == set()


def test_migrate_of_a_store_without_schema_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["migrate", "memory://"]) == 0
    assert capsys.readouterr().out == "memory:// stores keep no schema: nothing to migrate\n"


def test_migrate_errors_are_one_line_and_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "idem.db"
    asyncio.run(run_migrations(f"sqlite:///{path}"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE idemstore_migrations SET checksum = 'edited'")
    for url in (f"sqlite:///{path}", f"sqlite:///{tmp_path / 'missing' / 'idem.db'}"):
        assert main(["migrate", url]) == 2
        err = capsys.readouterr().err
        assert err.startswith("idemstore: error: ") and err.count("\n") == 1
        assert "Traceback" not in err


def test_dry_run_and_status_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["migrate", f"sqlite:///{tmp_path / 'x.db'}", "--dry-run", "--status"])
    assert exited.value.code == 2


# -- from the wheel ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_installed_wheel_migrates_with_its_own_migration_files(
    built_wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(built_wheel) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("idemstore/_migrations/")}
    assert {f"idemstore/_migrations/sqlite/{m.name}" for m in load_migrations("sqlite")} <= shipped
    for engine in ("sqlite", "postgres"):  # the live schema, for readers of an installed copy
        assert f"idemstore/_migrations/{engine}/{SCHEMA_FILE}" in shipped

    bin_dir = make_venv(tmp_path / "venv", f"{built_wheel}[sqlite]")
    work = tmp_path / "work"  # no migrations/ folder anywhere near: only the wheel's
    work.mkdir()

    def idemstore(*args: str) -> str:
        done = subprocess.run(
            [str(bin_dir / "idemstore"), *args],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "applied 0001_records.sql" in idemstore("migrate", "sqlite:///idem.db")
    assert "nothing to apply" in idemstore("migrate", "sqlite:///idem.db")
    status = idemstore("migrate", "sqlite:///idem.db", "--status")
    source = status.splitlines()[0].removeprefix("sqlite migrations from ")
    assert source.startswith(str(tmp_path / "venv")), status
    assert source.endswith("idemstore/_migrations/sqlite")
    assert "0 pending" in status
    assert "idemstore_records" in tables(work / "idem.db")


def test_migrate_creates_a_dynamodb_table_once_and_reports_it(
    dynamodb_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import uuid

    url = f"dynamodb://migrated_{uuid.uuid4().hex[:12]}?region=us-east-1&endpoint_url={dynamodb_endpoint}"
    assert main(["migrate", url, "--dry-run"]) == 0
    definition = json.loads(capsys.readouterr().out)
    assert definition["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert definition["BillingMode"] == "PAY_PER_REQUEST"
    assert main(["migrate", url, "--status"]) == 0
    assert "exists: False" in capsys.readouterr().out
    assert main(["migrate", url]) == 0
    assert "is ready" in capsys.readouterr().out
    assert main(["migrate", url]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["migrate", url, "--status"]) == 0
    status = capsys.readouterr().out
    assert "exists: True" in status and "ttl_enabled: True" in status
