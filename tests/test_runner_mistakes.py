"""Issue 28, cases 7 and 9: a user's mistake with the runner never runs the work twice.

A plain function where an async one is due, a decorated function whose result the serializer
cannot record: each is refused before the work runs where that can be known, and otherwise
recorded so that a retry gets the same clear error instead of a second run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pydantic
import pytest

from idemstore import Idempotency, JSONSerializer, UnrecordableResultError, open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from idemstore import IdempotencyStore


@pytest.fixture(params=["memory_store_url", "sqlite_file_store_url"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[IdempotencyStore]:
    async with open_store(request.getfixturevalue(request.param)) as opened:
        yield opened


def new_key() -> str:
    return f"mistake-{uuid.uuid4().hex[:12]}"


# -- run() given something that is not async ---------------------------------------------------


@pytest.fixture
def charges() -> list[int]:
    """The amount of each run of ``plain_charge``."""
    return []


@pytest.fixture
def plain_charge(charges: list[int]) -> Callable[..., bytes]:
    """A plain (not async) charge function: the mistake under test."""

    def charge(amount: int = 1) -> bytes:
        charges.append(amount)
        return b"charged"

    return charge


async def test_a_plain_function_is_refused_before_reserving_or_running(
    store: IdempotencyStore, plain_charge: Callable[..., bytes], charges: list[int]
) -> None:
    idem = Idempotency(store)
    key = new_key()
    for _ in range(2):
        with pytest.raises(TypeError, match="async def"):
            await idem.run(key, "fp", plain_charge)  # type: ignore[arg-type]
    assert charges == []
    assert await store.get(key) is None


async def test_a_partial_of_a_plain_function_is_refused_before_running(
    store: IdempotencyStore, plain_charge: Callable[..., bytes], charges: list[int]
) -> None:
    idem = Idempotency(store)
    with pytest.raises(TypeError, match="async def"):
        await idem.run(new_key(), "fp", functools.partial(plain_charge, 5))  # type: ignore[arg-type]
    assert charges == []


async def test_a_lambda_returning_bytes_runs_once_and_retries_get_the_error(
    store: IdempotencyStore, plain_charge: Callable[..., bytes], charges: list[int]
) -> None:
    # What a lambda returns is only known by calling it: it ran, so the key records that its
    # outcome could not be recorded, and every retry gets that instead of a second run.
    idem = Idempotency(store)
    key = new_key()
    with pytest.raises(TypeError, match="awaitable") as first:
        await idem.run(key, "fp", lambda: plain_charge())  # type: ignore[arg-type,return-value]
    assert isinstance(first.value, UnrecordableResultError)
    with pytest.raises(UnrecordableResultError, match="awaitable") as retry:
        await idem.run(key, "fp", lambda: plain_charge())  # type: ignore[arg-type,return-value]
    assert retry.value.key == key
    assert charges == [1]


async def test_a_lambda_returning_a_coroutine_still_runs(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    key = new_key()

    async def charge(amount: int) -> bytes:
        return str(amount).encode()

    first = await idem.run(key, "fp", lambda: charge(42))
    second = await idem.run(key, "fp", lambda: charge(42))
    assert (first.value, first.replayed, second.value, second.replayed) == (
        b"42",
        False,
        b"42",
        True,
    )


async def test_work_that_returns_no_bytes_is_not_run_again(store: IdempotencyStore) -> None:
    idem = Idempotency(store)
    key = new_key()
    runs: list[int] = []

    async def charge() -> str:
        runs.append(1)
        return "charged"

    for _ in range(2):
        with pytest.raises(TypeError, match="bytes"):
            await idem.run(key, "fp", charge)  # type: ignore[arg-type]
    assert runs == [1]


# -- the decorator ------------------------------------------------------------------------------


def test_decorating_a_plain_function_is_a_type_error_saying_async_def() -> None:
    idem = Idempotency(open_store("memory://"))

    def charge(order_id: str) -> int:
        return 1

    with pytest.raises(TypeError, match="async def"):
        idem.idempotent(key="order_id")(charge)  # type: ignore[arg-type]


@dataclasses.dataclass
class Address:
    city: str


@dataclasses.dataclass
class Receipt:
    order: str
    amount: int
    ship_to: Address


class Invoice(pydantic.BaseModel):
    order: str
    amount: int
    lines: list[str]


# How many times each order was charged (order ids are fresh keys: one test's alone).
CHARGED: Counter[str] = Counter()


async def charge_with_a_receipt(order_id: str, amount: int) -> Receipt:
    CHARGED[order_id] += 1
    return Receipt(order_id, amount, Address("Lyon"))


async def charge_with_an_invoice(order_id: str, amount: int) -> Invoice:
    CHARGED[order_id] += 1
    return Invoice(order=order_id, amount=amount, lines=["a", "b"])


# Per kind of typed result: the work, the result it returns for an order of 42, and the JSON
# value that result is recorded as.
TYPED: dict[str, tuple[Callable[[str, int], Awaitable[object]], Callable[[str], object], Any]] = {
    "dataclass": (
        charge_with_a_receipt,
        lambda key: Receipt(key, 42, Address("Lyon")),
        lambda key: {"order": key, "amount": 42, "ship_to": {"city": "Lyon"}},
    ),
    "pydantic": (
        charge_with_an_invoice,
        lambda key: Invoice(order=key, amount=42, lines=["a", "b"]),
        lambda key: {"order": key, "amount": 42, "lines": ["a", "b"]},
    ),
}


@pytest.mark.parametrize("kind", list(TYPED))
async def test_a_typed_result_is_recorded_and_replayed_as_the_same_type(
    store: IdempotencyStore, kind: str
) -> None:
    work, result_for, recorded_for = TYPED[kind]
    charge = Idempotency(store).idempotent(key="order_id")(work)
    key = new_key()
    first = await charge(key, 42)
    second = await charge(key, 42)
    # Equal to a result of the same type all the way down: a nested dataclass rebuilt as a
    # dict would not compare equal.
    assert first == second == result_for(key)
    assert type(second) is type(result_for(key))
    assert CHARGED[key] == 1
    record = await store.get(key)
    assert record is not None and record.response is not None
    assert json.loads(record.response) == recorded_for(key)


async def test_a_result_without_a_known_type_replays_as_its_json_value(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store)

    @idem.idempotent(key="order_id")
    async def charge(order_id: str) -> Any:
        return [Address("Oslo")]

    key = new_key()
    # The first call returns what its retries will: the recorded JSON value.
    assert await charge(key) == [{"city": "Oslo"}]
    assert await charge(key) == [{"city": "Oslo"}]


async def test_an_unserializable_result_names_its_type_and_never_runs_twice(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store)
    charges: list[str] = []

    class Opaque:
        pass

    @idem.idempotent(key="order_id")
    async def charge(order_id: str) -> object:
        charges.append(order_id)
        return {"handle": Opaque()}

    key = new_key()
    with pytest.raises(TypeError, match="Opaque") as first:
        await charge(key)
    assert isinstance(first.value, UnrecordableResultError)
    with pytest.raises(UnrecordableResultError, match="Opaque"):
        await charge(key)
    assert charges == [key]


async def test_a_custom_serializer_records_and_replays_results(store: IdempotencyStore) -> None:
    class Reversed:
        """Records the text reversed, to prove the serializer is the one used both ways."""

        def dumps(self, value: object) -> bytes:
            assert isinstance(value, str)
            return value[::-1].encode()

        def loads(self, data: bytes, returns: object) -> object:
            return data.decode()[::-1]

    idem = Idempotency(store, serializer=Reversed())
    key = new_key()

    @idem.idempotent(key="order_id")
    async def charge(order_id: str) -> str:
        return f"charged {order_id}"

    assert await charge(key) == await charge(key) == f"charged {key}"
    record = await store.get(key)
    assert record is not None and record.response == f"charged {key}"[::-1].encode()

    @idem.idempotent(key="order_id", serializer=JSONSerializer())
    async def refund(order_id: str) -> str:
        return "refunded"

    other = new_key()
    assert await refund(other) == await refund(other) == "refunded"
    record = await store.get(other)
    assert record is not None and record.response == b'"refunded"'


# -- options the runner does not take ----------------------------------------------------------


async def test_a_misspelt_option_is_named_in_a_type_error(store: IdempotencyStore) -> None:
    # The runner forwards its options to ExecutionPolicy: a misspelt one must still be
    # reported as the runner's, and an option only the policy takes must not slip through.
    with pytest.raises(TypeError, match=r"Idempotency\(\) got unknown options \['lease_tll'\]"):
        Idempotency(store, lease_tll=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"\['consumer'\]"):
        Idempotency(store, consumer="mine")  # type: ignore[call-arg]
