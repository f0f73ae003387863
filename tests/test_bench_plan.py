"""What ``idemstore bench`` says before it runs (its plan and estimate), the progress total,
and the ports ``--local`` servers may take."""

from __future__ import annotations

import importlib
import random
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from pathlib import Path


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


def test_free_ports_come_from_the_range_each_once_until_it_runs_out() -> None:
    first = random.randrange(30000, 32000, 4)
    ports = range(first, first + 3)
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
