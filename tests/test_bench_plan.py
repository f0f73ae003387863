"""What ``idemstore bench`` says before it runs (its plan and estimate), the progress total,
and the ports ``--local`` servers may take."""

from __future__ import annotations

import contextlib
import importlib
import os
import pty
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from idemstore import cli
from idemstore.bench.estimate import plan_run
from idemstore.bench.local import Launcher, start_local_servers
from idemstore.bench.runner import BenchConfig, Target, run_bench
from idemstore.local_servers import (
    ServerUnavailableError,
    free_port,
    parse_port_range,
    ports_from,
)

ROOT = Path(__file__).resolve().parent.parent


def timed(duration: float, *scenarios: str) -> BenchConfig:
    return BenchConfig(scenarios=scenarios, concurrency=(1, 16), ops=None, duration=duration)


def test_a_timed_run_is_estimated_from_its_scenarios_duration_and_backends() -> None:
    one, two = timed(1, "fresh", "replay"), timed(2, "fresh", "replay")
    short, long = plan_run(one, ["memory://"]), plan_run(two, ["memory://"])
    assert short.seconds is not None and long.seconds is not None
    # Each extra second is timed on the store and on its floor, per scenario and concurrency.
    assert long.seconds - short.seconds == pytest.approx(2 * 2 * 2)
    both = plan_run(one, ["memory://", "memory://"])
    assert both.seconds == pytest.approx(2 * short.seconds) and both.backends == 2
    assert f"about {short.seconds:.0f} s" in short.describe(one)


def test_a_run_by_operation_count_says_its_time_is_not_known() -> None:
    config = BenchConfig(scenarios=("fresh",), ops=500)
    plan = plan_run(config, [])
    assert plan.seconds is None
    assert "500 operations each" in plan.describe(config) and "--duration" in plan.describe(config)


class Recorder:
    def __init__(self) -> None:
        self.total = 0
        self.advanced = 0

    def start(self, total: int) -> None:
        self.total = total

    def step(self, description: str) -> None:
        return None

    def advance(self) -> None:
        self.advanced += 1


async def test_the_progress_bar_counts_every_step_the_plan_counts() -> None:
    config = BenchConfig(
        scenarios=("fresh", "wake", "hasher", "telemetry", "middleware"),
        concurrency=(1, 2),
        ops=8,
    )
    recorder = Recorder()
    await run_bench([Target("memory", "memory://")], config, progress=recorder)
    assert recorder.total == plan_run(config, ["memory://"]).steps == 2 + 1 + 3
    assert recorder.advanced == recorder.total


def test_a_port_range_is_two_ports_with_a_dash() -> None:
    assert parse_port_range("21000-21100") == range(21000, 21101)
    for wrong in ("21000", "a-b", "21100-21000", "80-90", "60000-70000"):
        with pytest.raises(ValueError, match=r"21000-21100|port range"):
            parse_port_range(wrong)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_free_ports_come_from_the_range_each_once_until_it_runs_out() -> None:
    # A range none of whose ports a server of another test (or lane) holds right now: the
    # runs-out check must be about the range, not about a neighbour's listener.
    for _ in range(50):
        first = random.randrange(30000, 32000, 4)
        ports = range(first, first + 3)
        if all(_bindable(port) for port in ports):
            break
    with ports_from(ports):
        picked = {free_port() for _ in ports}
        with pytest.raises(ServerUnavailableError, match="--ports"):
            free_port()
    assert picked == set(ports)


def test_a_bad_ports_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--local", "--ports", "22000"])
    assert exited.value.code == 2
    assert "a port range looks like 21000-21100" in capsys.readouterr().err
    assert cli.main(["bench", "--ports", "22000-22100"]) == 2
    assert "add --local" in capsys.readouterr().err


def start_without_moto(where: Path) -> None:
    try:
        importlib.import_module("idemstore_no_such_module")
    except ImportError as exc:
        raise ServerUnavailableError("moto is not installed") from exc


def test_a_launcher_missing_a_python_package_is_skipped_with_the_local_extra(
    tmp_path: Path,
) -> None:
    running, missing = start_local_servers(
        tmp_path, [Launcher("dynamodb", __name__, "start_without_moto")]
    )
    assert running == [] and [(u.backend, u.extra) for u in missing] == [("dynamodb", "local")]


def test_the_plan_goes_to_stderr_and_a_pipe_gets_no_progress(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "memory://", "--duration", "0.05", "--concurrency", "1", "--scenario", "fresh"]
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert err.startswith("idemstore bench: 1 measurement on 1 backend, 0.05 s each: about")
    assert "memory fresh" not in err and "memory" in out


def test_a_terminal_sees_the_progress_bar(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal: the progress bar names the step it runs."""
    main, child = pty.openpty()
    args = ["memory://", "--ops", "50", "--concurrency", "1", "--scenario", "fresh", "wake"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100", TERM="xterm")
    with subprocess.Popen(
        [sys.executable, "-m", "idemstore", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=child,
        cwd=tmp_path,
        env=env,
    ) as process:
        os.close(child)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the child closes its end
            while chunk := os.read(main, 4096):
                seen += chunk
        assert process.wait(timeout=120) == 0
    os.close(main)
    assert b"memory fresh x1" in seen or b"memory wake" in seen
