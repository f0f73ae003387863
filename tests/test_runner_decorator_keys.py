"""Issue 14, case 8: ``@idem.idempotent(key=...)`` when the key argument is ``None``."""

from __future__ import annotations

import uuid

import pytest

from idemstore import Idempotency, InvalidKeyError, open_store


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
