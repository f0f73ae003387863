"""Settling inside the caller's transaction (issue 29) through an instrumented SQL store."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ExecutionPolicy, Replay, open_store
from tests.settling.business import open_business

if TYPE_CHECKING:
    from tests.telemetry.conftest import Telemetry


@pytest.mark.parametrize("url_fixture", ["postgres_store_url", "sqlite_file_store_url"])
async def test_an_instrumented_store_settles_in_the_transaction_and_its_span_says_settled(
    request: pytest.FixtureRequest, url_fixture: str, telemetry: Telemetry
) -> None:
    url: str = request.getfixturevalue(url_fixture)
    key = f"settle-{uuid.uuid4().hex[:12]}"
    business = await open_business(url)
    try:
        await business.create_table()
        async with open_store(url) as instrumented:  # opened after instrument()
            claim = await ExecutionPolicy(instrumented).begin(key, "fp")
            assert not isinstance(claim, Replay)
            async with claim:
                await business.begin()
                await business.charge(key)
                await claim.settle(b"charged", connection=business.connection)
                await business.commit()
        assert await business.charges() == {key: 1}
    finally:
        await business.close()
    (consumer,) = telemetry.spans("idemstore runner")
    assert consumer.attributes is not None
    assert consumer.attributes["idemstore.outcome"] == "settled"
