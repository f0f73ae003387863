"""``idempotent_task`` outside a worker: how the key is found, and the mistake of calling a
task-id-keyed function directly."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from idemstore import InvalidKeyError
from idemstore.consumers.celery import idempotent_task
from idemstore.sync import Idempotency


def test_a_task_keyed_by_its_id_called_outside_celery_is_refused_clearly() -> None:
    with Idempotency("memory://") as idem:

        @idempotent_task(idem)
        def charge(order: str) -> str:
            return order

        with pytest.raises(InvalidKeyError, match="no Celery task is running"):
            charge("o-1")


def test_a_key_from_the_arguments_works_anywhere() -> None:
    calls: list[str] = []
    with Idempotency("memory://") as idem:

        @idempotent_task(idem, key=lambda order: f"order:{order}")
        def charge(order: str) -> str:
            calls.append(order)
            return order

        order = uuid.uuid4().hex
        assert charge(order) == charge(order) == order
    assert calls == [order]


def test_a_redelivery_differing_only_in_an_excluded_argument_replays() -> None:
    calls: list[str] = []
    with Idempotency("memory://") as idem:

        @idempotent_task(idem, key=lambda order, sent_at: order, fingerprint_exclude=["/sent_at"])
        def charge(order: str, sent_at: float) -> str:
            calls.append(order)
            return order

        order = uuid.uuid4().hex
        assert charge(order, 1.0) == charge(order, 2.0) == order
    assert calls == [order]


def test_a_task_s_function_called_inside_another_task_is_refused_clearly() -> None:
    app = Celery("nested", set_as_current=False)
    calls: list[str] = []
    with Idempotency("memory://") as idem:

        @app.task
        @idempotent_task(idem)
        def charge(order: str) -> str:
            calls.append(order)
            return order

        @app.task
        def charge_each(orders: list[str]) -> list[str]:
            outcomes = []
            for order in orders:
                try:
                    outcomes.append(charge.run(order))
                except InvalidKeyError as exc:
                    outcomes.append(str(exc))
            return outcomes

        outcomes = charge_each.apply((["ann", "ben", "ann"],)).get()
        assert charge.apply(("cat",), task_id="t-cat").get() == "cat"  # its own delivery
    assert all("called inside task" in outcome for outcome in outcomes), outcomes
    assert calls == ["cat"]
