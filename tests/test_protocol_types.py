"""Record, Lease and Reservation write their slots in hand-written ``__init__``s (for speed):
they must still behave exactly like the frozen dataclasses they are declared as."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from idemstore.protocol import Lease, Outcome, Record, Reservation, Status

LEASE = Lease("scope", "key", "token", 3, 1700000000.5, 60.0)
RECORD = Record("scope", "key", "fp", Status.COMPLETED, "token", 3, b"body", 1.0, 2.0, None)
RESERVATION = Reservation(Outcome.ACQUIRED, LEASE, None, True)


@pytest.mark.parametrize("cls", [Record, Lease, Reservation])
def test_init_takes_every_field_in_order_with_the_declared_defaults(cls: type) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    declared = dataclasses.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in declared]
    for parameter, field in zip(parameters, declared, strict=True):
        expected = (
            inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        )
        assert parameter.default == expected


@pytest.mark.parametrize("value", [RECORD, LEASE, RESERVATION])
def test_every_field_holds_what_was_given_by_position_or_by_keyword(value: Any) -> None:
    by_keyword = type(value)(**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    assert by_keyword == value
    assert hash(by_keyword) == hash(value)
    assert dataclasses.astuple(by_keyword) == dataclasses.astuple(value)


def test_fields_are_as_given() -> None:
    assert (LEASE.scope, LEASE.key, LEASE.token, LEASE.fence) == ("scope", "key", "token", 3)
    assert (LEASE.lease_expires_at, LEASE.retention) == (1700000000.5, 60.0)
    assert RECORD.status is Status.COMPLETED and RECORD.response == b"body"
    assert RECORD.lease_expires_at is None and RECORD.expires_at == 2.0
    assert RESERVATION.lease is LEASE and RESERVATION.takeover and RESERVATION.acquired
    assert Reservation(Outcome.IN_PROGRESS) == Reservation(Outcome.IN_PROGRESS, None, None, False)


@pytest.mark.parametrize("value", [RECORD, LEASE, RESERVATION])
def test_instances_stay_immutable(value: Any) -> None:
    name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, "changed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(value, name)


@pytest.mark.parametrize("value", [RECORD, LEASE, RESERVATION])
def test_instances_pickle_and_replace_like_dataclasses(value: Any) -> None:
    assert pickle.loads(pickle.dumps(value)) == value
    first = dataclasses.fields(value)[0].name
    changed = dataclasses.replace(value, **{first: getattr(value, first)})
    assert changed == value and changed is not value
    assert repr(value).startswith(type(value).__name__ + "(")


def test_a_lease_differs_from_one_with_any_field_changed() -> None:
    for field in dataclasses.fields(LEASE):
        changes: dict[str, Any] = {field.name: "x"}
        other = dataclasses.replace(LEASE, **changes)
        assert other != LEASE
