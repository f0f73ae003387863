"""Issue 29: ``settle`` and ``checkpoint`` into the caller's transaction are refused before
anything is written when the connection cannot carry them: no open transaction, another
engine's connection, another SQLite file. Each case runs for both calls."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import ExecutionPolicy, open_store
from tests.settling.owners import owned
from tests.settling.refusals import checkpoint_one, refused, refused_elsewhere, settle_x

if TYPE_CHECKING:
    from pathlib import Path

    from idemstore import IdempotencyStore
    from tests.settling.business import Business
    from tests.settling.refusals import Attempt


@pytest.fixture(params=[settle_x, checkpoint_one], ids=["settle", "checkpoint"])
def attempt(request: pytest.FixtureRequest) -> Attempt:
    call: Attempt = request.param
    return call


# What the refusal tells a caller whose store is outside the database to do instead.
WITHOUT_A_CONNECTION = {
    settle_x: "settle(response) without a connection",
    checkpoint_one: "checkpoint(name, data) without a connection",
}


def new_key() -> str:
    return f"refused-{uuid.uuid4().hex[:12]}"


async def test_a_connection_without_an_open_transaction_is_refused(
    store: IdempotencyStore, business: Business, attempt: Attempt
) -> None:
    execution = await owned(ExecutionPolicy(store), new_key())
    assert "transaction open" in await refused(execution, business.connection, attempt)


async def test_a_connection_of_another_engine_is_refused(
    store: IdempotencyStore, business: Business, attempt: Attempt
) -> None:
    execution = await owned(ExecutionPolicy(store), new_key())
    assert "needs an" in await refused(execution, object(), attempt)


async def test_a_connection_to_another_sqlite_file_is_refused(
    sqlite_file_store_url: str, tmp_path: Path, attempt: Attempt
) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    message = await refused_elsewhere(sqlite_file_store_url, other_url, attempt)
    assert "Nothing was recorded" in message


@pytest.mark.parametrize("url_fixture", ["memory_store_url", "redis_store_url"])
async def test_a_store_outside_the_database_is_refused_saying_what_to_do_instead(
    request: pytest.FixtureRequest, url_fixture: str, business: Business, attempt: Attempt
) -> None:
    async with open_store(request.getfixturevalue(url_fixture)) as elsewhere:
        execution = await owned(ExecutionPolicy(elsewhere), new_key())
        message = await refused(execution, business.connection, attempt)
    assert WITHOUT_A_CONNECTION[attempt] in message
