from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

from idemstore.cli import main

if TYPE_CHECKING:
    import pytest


def test_inspect_of_an_absent_key_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "memory://", "nope"]) == 1
    assert "no live record" in capsys.readouterr().err


def test_sweep_once_prints_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "memory://"]) == 0
    assert "swept 0 expired record(s)" in capsys.readouterr().out


def test_a_bad_url_is_one_line_and_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "nosuch://x", "k"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("idemstore: error: unknown store scheme")
    assert "Traceback" not in err and err.count("\n") == 1


def test_module_entry_point_prints_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "idemstore", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert "inspect" in done.stdout and "sweep" in done.stdout
