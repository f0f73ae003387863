from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import TYPE_CHECKING

from idemstore import open_store
from idemstore.cli import main
from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

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


def test_sweep_loop_survives_a_failing_pass_and_stops_on_sigterm() -> None:
    import os
    import signal
    import time

    from idemstore.local_servers import ServerUnavailableError
    from idemstore.local_servers.redis import start_redis
    from tests.conftest import backend_unavailable

    try:
        redis = start_redis()  # our own: this test takes it down
    except ServerUnavailableError as exc:
        backend_unavailable("redis", str(exc))
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "idemstore",
                "sweep",
                redis.url + "?socket_timeout=0.5",
                "--every",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        # Wait for the first pass to succeed before taking Redis down: a fixed sleep lost the
        # race to a slow interpreter start on a loaded CI machine, and a first pass that fails
        # ends the command (a wrong URL should not loop).
        assert proc.stdout is not None
        first = proc.stdout.readline()
        redis.shutdown()  # every pass fails from now on
        time.sleep(2.0)
        still_running = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        redis.stop()
    assert "swept 0 expired record(s)" in first, err
    assert still_running, err
    assert proc.returncode == 0, err
    assert "sweep failed" in err
    assert "Traceback" not in err
    assert "stopped;" in out


def test_inspect_shows_each_checkpoint_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"

    async def record_two_steps() -> None:
        async with open_store(url) as store:
            reservation = await store.reserve("k", "fp", lease_ttl=60, retention=60)
            assert reservation.lease is not None
            await store.checkpoint(reservation.lease, "charged", b"ch_1")  # type: ignore[attr-defined]
            await store.checkpoint(reservation.lease, "shipped", b"\xff")  # type: ignore[attr-defined]

    asyncio.run(record_two_steps())
    assert main(["inspect", url, "k"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint 1: 'charged' ch_1" in out
    assert "checkpoint 2: 'shipped' <1 bytes, not UTF-8> ff" in out
