"""`idemstore options`: every engine's URL options, printed from the table its store checks
them with, without the engine's driver."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from idemstore.backends.registry import Engine, engines, load_target, register_backend
from idemstore.cli import build_parser, main
from tests.conftest import ROOT

if TYPE_CHECKING:
    from idemstore.backends.store_options import Options

WITH_TABLES = [engine.name for engine in engines() if engine.options is not None]


def test_every_built_in_engine_declares_its_options_table() -> None:
    assert WITH_TABLES == ["memory", "sqlite", "postgres", "redis", "dynamodb"]


def test_without_an_engine_it_lists_every_registered_engine_and_scheme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["options"]) == 0
    out = capsys.readouterr().out
    for engine in engines():
        assert engine.name in out
        assert all(f"{scheme}://" in out for scheme in engine.schemes)


@pytest.mark.parametrize("name", WITH_TABLES)
def test_an_engine_s_options_are_its_table_s_rows_within_80_columns(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["options", name]) == 0
    out = capsys.readouterr().out
    engine = next(engine for engine in engines() if engine.name == name)
    assert engine.options is not None
    table: Options = load_target(engine.options)
    assert table.text() in out
    for option in table:
        assert option.name in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_table_text_shows_name_type_default_and_doc_without_markup() -> None:
    from idemstore.backends.store_options import Option, Options

    table = Options(
        Option("busy", float, 5.0, "seconds to wait before `StoreUnavailableError`"),
        Option("clock", object, None, "time", url=False),
    )
    assert table.text() == textwrap.dedent(
        """\
        option  type   default
        busy    float  5
            seconds to wait before StoreUnavailableError

        As keywords only: clock
        """
    )


@pytest.mark.parametrize("given", ["postgresql", "POSTGRES", "postgresql://u:p@h/db?x=1"])
def test_an_engine_is_found_by_its_scheme_or_a_url_of_it(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["options", given]) == 0
    assert capsys.readouterr().out.startswith("postgres: postgresql://, postgres://")


def test_an_unknown_engine_is_refused_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["options", "cassandra"]) == 2
    err = capsys.readouterr().err
    assert "no engine or URL scheme is called 'cassandra'" in err
    assert all(engine.name in err for engine in engines())


def test_an_engine_without_a_table_says_so(
    scratch_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    register_backend(Engine(name="plain", schemes=("plain",), store="mypkg.store:PlainStore"))
    assert main(["options", "plain"]) == 1
    assert "declares no options table" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["migrate", "inspect", "sweep", "stats", "bench"])
def test_every_command_taking_a_store_url_points_to_the_options_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "idemstore options ENGINE" in capsys.readouterr().out


def test_options_print_with_every_engine_driver_unimportable() -> None:
    # A fresh interpreter where importing any engine's driver fails, as when its extra is not
    # installed: the tables must still print, and no driver may have been imported.
    script = textwrap.dedent(
        """
        import sys
        from idemstore.backends.registry import engines
        drivers = {e.driver for e in engines() if e.driver} | {"botocore"}
        for driver in drivers:
            sys.modules[driver] = None  # import raises ImportError
        from idemstore.cli import main
        for engine in engines():
            if engine.options is not None:
                assert main(["options", engine.name]) == 0, engine.name
        print("imported:", sorted(d for d in drivers if sys.modules.get(d) is not None))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "imported: []" in done.stdout
    for name in WITH_TABLES:
        assert f"{name}: " in done.stdout
        assert "max_key_length" in done.stdout


def test_the_cli_reference_shows_the_command_s_current_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    shown = page.split("$ idemstore options sqlite\n", 1)[1].split("```", 1)[0]
    assert main(["options", "sqlite"]) == 0
    assert shown == capsys.readouterr().out
