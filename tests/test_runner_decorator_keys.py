"""How ``@idem.idempotent`` derives a call's key and fingerprint: a ``None`` key (issue 14,
case 8), and the arguments the fingerprint leaves out or picks (issue 32)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from idemstore import ConfigurationError, ConflictError, Idempotency, InvalidKeyError, open_store


@pytest.mark.parametrize("url_fixture", ["memory_store_url", "sqlite_file_store_url"])
async def test_a_none_key_runs_every_call_without_deduplication(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    async with open_store(request.getfixturevalue(url_fixture)) as store:
        idem = Idempotency(store)
        charges: list[int] = []

        @idem.idempotent(key="order_id")
        async def charge(order_id: str | None, amount: int) -> int:
            charges.append(amount)
            return len(charges)

        # Two different orders without a key: both charged, neither replays the other's result.
        assert await charge(None, 10) == 1
        assert await charge(None, 20) == 2
        assert await charge(order_id=None, amount=10) == 3
        assert charges == [10, 20, 10]
        assert await store.get("None") is None

        # A real key still deduplicates.
        order = uuid.uuid4().hex
        assert await charge(order, 30) == 4
        assert await charge(order, 30) == 4
        assert charges == [10, 20, 10, 30]


async def test_require_key_makes_a_none_key_an_error_that_runs_nothing() -> None:
    async with open_store("memory://") as store:
        idem = Idempotency(store)
        runs = 0

        @idem.idempotent(key=lambda order_id: order_id, require_key=True)
        async def charge(order_id: str | None) -> None:
            nonlocal runs
            runs += 1

        with pytest.raises(InvalidKeyError, match="without an idempotency key"):
            await charge(None)
        assert runs == 0


async def test_an_excluded_argument_field_does_not_make_a_retry_a_conflict() -> None:
    async with open_store("memory://") as store:
        idem = Idempotency(store)
        charges: list[int] = []

        @idem.idempotent(key="order_id", fingerprint_exclude=["/trace_id", "/meta/sent_at"])
        async def charge(order_id: str, amount: int, trace_id: str, meta: dict[str, int]) -> int:
            charges.append(amount)
            return len(charges)

        order = uuid.uuid4().hex
        assert await charge(order, 10, "t1", {"sent_at": 1, "try": 1}) == 1
        assert await charge(order, 10, "t2", {"sent_at": 2, "try": 1}) == 1
        with pytest.raises(ConflictError):
            await charge(order, 20, "t3", {"sent_at": 3, "try": 1})
        with pytest.raises(ConflictError):
            await charge(order, 10, "t3", {"sent_at": 3, "try": 2})
        assert charges == [10]


async def test_only_included_arguments_decide_whether_a_retry_conflicts() -> None:
    async with open_store("memory://") as store:
        idem = Idempotency(store)
        runs: list[str] = []

        @idem.idempotent(key="order_id", fingerprint_include=["/amount"])
        async def charge(order_id: str, amount: int, note: str) -> int:
            runs.append(note)
            return amount

        order = uuid.uuid4().hex
        assert await charge(order, 10, "first") == 10
        assert await charge(order, 10, "retry") == 10
        with pytest.raises(ConflictError):
            await charge(order, 11, "first")
        assert runs == ["first"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fingerprint_exclude": ["/trace"]}, "no argument named 'trace'"),
        ({"fingerprint_exclude": ["trace_id"]}, "start it with /"),
        ({"fingerprint_include": ["/amount"], "fingerprint_exclude": ["/trace_id"]}, "not both"),
    ],
)
async def test_a_bad_fingerprint_pointer_is_refused_at_decoration(
    options: dict[str, Any], message: str
) -> None:
    async with open_store("memory://") as store:
        idem = Idempotency(store)

        async def charge(order_id: str, amount: int, trace_id: str) -> None:
            pass

        with pytest.raises(ConfigurationError, match=message):
            idem.idempotent(key="order_id", **options)(charge)
