"""Settling inside the caller's transaction (issue 29) through an instrumented SQL store."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ExecutionPolicy, Replay, open_store
from idemstore.execution.settling import in_transaction_store
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


DURATION = "idemstore.store.operation.duration"


@pytest.mark.parametrize("url_fixture", ["postgres_store_url", "sqlite_file_store_url"])
async def test_a_completion_in_the_callers_transaction_is_metered_as_complete_within(
    request: pytest.FixtureRequest, url_fixture: str, telemetry: Telemetry
) -> None:
    url: str = request.getfixturevalue(url_fixture)
    key = f"settle-{uuid.uuid4().hex[:12]}"
    business = await open_business(url)
    try:
        async with open_store(url) as instrumented:
            claim = await ExecutionPolicy(instrumented).begin(key, "fp")
            assert not isinstance(claim, Replay)
            async with claim:
                await business.begin()
                await claim.settle(b"charged", connection=business.connection)
                await business.commit()
    finally:
        await business.close()
    (span,) = telemetry.spans("idemstore complete_within")
    assert span.attributes is not None
    assert span.attributes["idemstore.outcome"] == "completed"
    assert span.attributes["idemstore.fence"] == 1
    assert telemetry.total(DURATION, **{"idemstore.operation": "complete_within"}) == 1
    assert telemetry.total(DURATION, **{"idemstore.operation": "complete"}) == 0


@pytest.mark.parametrize("url_fixture", ["postgres_store_url", "sqlite_file_store_url"])
async def test_a_stale_owner_refused_by_complete_within_counts_as_fenced_out(
    request: pytest.FixtureRequest, url_fixture: str, telemetry: Telemetry
) -> None:
    url: str = request.getfixturevalue(url_fixture)
    key = f"settle-{uuid.uuid4().hex[:12]}"
    business = await open_business(url)
    try:
        async with open_store(url) as instrumented:
            reservation = await instrumented.reserve(key, "fp", lease_ttl=60, retention=60)
            assert reservation.lease is not None
            assert await instrumented.release(reservation.lease) is True
            await business.begin()
            settles = in_transaction_store(instrumented)
            await settles.check_connection(business.connection)
            late = await settles.complete_within(
                business.connection, reservation.lease, b"late", 60.0
            )
            await business.rollback()
        assert late is False
    finally:
        await business.close()
    fenced_out = "idemstore.lease.fenced_out"
    assert telemetry.total(fenced_out, **{"idemstore.operation": "complete_within"}) == 1
    (span,) = telemetry.spans("idemstore complete_within")
    assert span.attributes is not None
    assert span.attributes["idemstore.outcome"] == "fenced_out"
