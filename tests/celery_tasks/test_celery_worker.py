"""Celery tasks under a real worker and a Redis broker: each task's effect runs once per key,
whether it is delivered twice or redelivered after its worker was SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT
from tests.loopback_process import stop_process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow


class Deployment:
    def __init__(self, broker: str, store: str, effects: Path, tmp_path: Path) -> None:
        self.effects = effects
        self.tmp_path = tmp_path
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "IDEMSTORE_TEST_BROKER": broker,
            "IDEMSTORE_TEST_STORE": store,
            "IDEMSTORE_TEST_EFFECTS": str(effects),
        }

    @contextlib.contextmanager
    def worker(
        self, *, pool: str = "threads", concurrency: int = 4
    ) -> Iterator[subprocess.Popen[bytes]]:
        log = self.tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "tests.celery_tasks.app", "worker"),
                    *("-P", pool, "-c", str(concurrency), "--loglevel", "INFO"),
                    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            yield process
        finally:
            stop_process(process, timeout=20)

    def send(self, task: str, *args: object, task_id: str | None = None) -> None:
        code = (
            "import sys, json; from tests.celery_tasks.app import app;"
            f" app.send_task({task!r}, args=json.loads(sys.argv[1]), task_id=sys.argv[2] or None)"
        )
        import json

        subprocess.run(
            [sys.executable, "-c", code, json.dumps(list(args)), task_id or ""],
            cwd=ROOT,
            env=self.env,
            check=True,
            timeout=60,
        )

    def charge_killed_mid_task_and_redelivered(self, order: str) -> str:
        """``charge(order)`` sent; its worker SIGKILLed once the task started; then a new
        worker runs until the broker's redelivery of that task finished. Returns the task id."""
        task_id = uuid.uuid4().hex
        with self.worker(pool="solo", concurrency=1) as doomed:
            self.send("tests.celery_tasks.app.charge", order, 5, task_id=task_id)
            self.wait_for(f"start {order}", 1)
            os.kill(doomed.pid, signal.SIGKILL)
            doomed.wait()
        # The broker redelivers the unacknowledged task; the new worker takes the key over
        # once the dead worker's lease lapsed.
        with self.worker():
            self.wait_for(f"postrun {task_id}", 1, timeout=90)
        return task_id

    def lines(self) -> list[str]:
        return self.effects.read_text().splitlines()

    def wait_for(self, line_start: str, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while sum(line.startswith(line_start) for line in self.lines()) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"{count} x {line_start!r} not seen; effects: {self.lines()}")
            time.sleep(0.1)


@pytest.fixture(params=["redis", "postgres"])
def deployment(request: pytest.FixtureRequest, redis_server_url: str, tmp_path: Path) -> Deployment:
    store = request.getfixturevalue(f"{request.param}_store_url")
    # A broker database of its own per test: no task of another test is delivered here.
    broker = f"{redis_server_url.rsplit('/', 1)[0]}/{9 + (uuid.uuid4().int % 6)}"
    effects = tmp_path / "effects.txt"
    effects.touch()
    return Deployment(broker, store, effects, tmp_path)


def test_a_task_delivered_twice_runs_its_effect_once(deployment: Deployment) -> None:
    task_id = uuid.uuid4().hex
    with deployment.worker():
        deployment.send("tests.celery_tasks.app.charge", "o-1", 0.5, task_id=task_id)
        deployment.send("tests.celery_tasks.app.charge", "o-1", 0.5, task_id=task_id)
        deployment.wait_for(f"postrun {task_id} SUCCESS", 2)
    assert [line for line in deployment.lines() if line.startswith("start")] == [
        "start o-1 takeover=False"
    ]


def test_tasks_keyed_by_their_arguments_run_once_per_key(deployment: Deployment) -> None:
    with deployment.worker():
        for _ in range(3):
            deployment.send("tests.celery_tasks.app.charge_by_order", "o-2", 0.3)
        deployment.wait_for("postrun", 3)
    assert [line for line in deployment.lines() if line.startswith("start")] == [
        "start o-2 takeover=False"
    ]
    assert all(line.endswith("SUCCESS") for line in deployment.lines() if "postrun" in line)


def test_a_task_s_function_called_inside_another_task_is_refused(deployment: Deployment) -> None:
    # Issue #40, case 8: keyed by the outer task's id, ann ran, ben was a ConflictError and
    # ann's second call was silently replayed. Each call is now refused, none runs.
    task_id = uuid.uuid4().hex
    with deployment.worker():
        deployment.send(
            "tests.celery_tasks.app.charge_each", ["ann", "ben", "ann"], task_id=task_id
        )
        deployment.wait_for(f"postrun {task_id}", 1)
    assert [line for line in deployment.lines() if line.startswith(("nested", "start"))] == [
        "nested ann InvalidKeyError",
        "nested ben InvalidKeyError",
        "nested ann InvalidKeyError",
    ]


def test_a_task_redelivered_after_its_worker_was_killed_resumes_once(
    deployment: Deployment,
) -> None:
    # The worker taking over runs the effect again (on_takeover="run").
    deployment.charge_killed_mid_task_and_redelivered("o-3")
    starts = [line for line in deployment.lines() if line.startswith("start")]
    assert starts == ["start o-3 takeover=False", "start o-3 takeover=True"]


def test_under_refuse_a_task_redelivered_after_a_kill_never_runs_twice(
    deployment: Deployment,
) -> None:
    deployment.env["IDEMSTORE_TEST_TAKEOVER"] = "refuse"
    task_id = deployment.charge_killed_mid_task_and_redelivered("o-4")
    assert [line for line in deployment.lines() if line.startswith("start")] == [
        "start o-4 takeover=False"
    ]
    # The outcome is unknown (the killed run may have charged): the task fails, visibly.
    assert f"postrun {task_id} FAILURE" in deployment.lines()
