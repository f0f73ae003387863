"""The Celery app the tests' workers run: a task whose side effect is a line in a file.

Configured from the environment: ``IDEMSTORE_TEST_BROKER`` (a Redis URL), ``IDEMSTORE_TEST_STORE``,
``IDEMSTORE_TEST_EFFECTS`` (the file every worker appends to) and ``IDEMSTORE_TEST_TAKEOVER``
(the runner's ``on_takeover``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import task_postrun

from idemstore.consumers.celery import idempotent_task
from idemstore.execution import current_execution
from idemstore.sync import Idempotency

app = Celery("idemstore_tests", broker=os.environ["IDEMSTORE_TEST_BROKER"])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    # A killed worker's unacknowledged task comes back after this many seconds.
    # (kombu's Redis transport looks for them every unacked_restore_interval seconds).
    broker_transport_options={
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
)
EFFECTS = Path(os.environ["IDEMSTORE_TEST_EFFECTS"])
idem = Idempotency(
    os.environ["IDEMSTORE_TEST_STORE"],
    lease_ttl=1.5,
    on_takeover=os.environ.get("IDEMSTORE_TEST_TAKEOVER", "run"),  # type: ignore[arg-type]
)


def _effect(line: str) -> None:
    with EFFECTS.open("a") as out:
        out.write(line + "\n")


@app.task
@idempotent_task(idem)
def charge(order: str, seconds: float) -> dict[str, Any]:
    execution = current_execution()
    takeover = execution is not None and execution.takeover
    _effect(f"start {order} takeover={takeover}")
    time.sleep(seconds)
    _effect(f"done {order}")
    return {"order": order, "pid": os.getpid()}


@app.task
@idempotent_task(idem, key=lambda order, seconds: f"order:{order}")
def charge_by_order(order: str, seconds: float) -> dict[str, Any]:
    _effect(f"start {order} takeover=False")
    time.sleep(seconds)
    _effect(f"done {order}")
    return {"order": order}


@app.task
def charge_each(orders: list[str]) -> None:
    """Calls ``charge``'s function once per order inside this one task (issue #40, case 8):
    each call says how it ended, as a line ``nested <order> <outcome>``."""
    for order in orders:
        try:
            charge.run(order, 0)
        except Exception as exc:
            _effect(f"nested {order} {type(exc).__name__}")
        else:
            _effect(f"nested {order} returned")


@task_postrun.connect
def _delivered(task_id: str, state: str, **_: Any) -> None:
    # Every delivery that ended, with how: the tests wait for these.
    _effect(f"postrun {task_id} {state}")
