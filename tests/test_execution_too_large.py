"""Issue 28: a result too large for the store never leads to a silent second run.

The key records that its outcome was too large (a marker in place of the response), and every
retry gets ``OutcomeTooLargeError`` naming the size and the limit instead of running again.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

import pytest

from idemstore import (
    Idempotency,
    OutcomeTooLargeError,
    ResponseTooLargeError,
    open_store,
)
from idemstore.testing.stores import SizeLimitedStore
from idemstore.testing.work import returns

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore import IdempotencyStore


def new_key() -> str:
    return f"large-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(request: pytest.FixtureRequest) -> AsyncIterator[IdempotencyStore]:
    """The store behind the URL fixture the test names (``indirect``), opened."""
    async with open_store(request.getfixturevalue(request.param)) as opened:
        yield opened


async def retry_error_after_one_run(
    idem: Idempotency, key: str, result: bytes
) -> OutcomeTooLargeError:
    """Run work returning ``result`` under ``key``, then retry it: the work ran once, and the
    retry's ``OutcomeTooLargeError`` is returned."""
    runs = 0

    async def work() -> bytes:
        nonlocal runs
        runs += 1
        return result

    first = await idem.run(key, "fp", work)
    # The first caller has the value in hand: it gets it, not recorded.
    assert first.value == result and not first.replayed
    with pytest.raises(OutcomeTooLargeError) as retry:
        await idem.run(key, "fp", work)
    assert runs == 1
    return retry.value


@pytest.mark.parametrize("store", ["memory_store_url", "sqlite_file_store_url"], indirect=True)
async def test_a_result_over_max_response_bytes_is_never_run_again(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store, max_response_bytes=100)
    key = new_key()
    error = await retry_error_after_one_run(idem, key, b"x" * 1000)
    assert isinstance(error, ResponseTooLargeError)
    assert (error.key, error.size, error.limit) == (key, 1000, 100)
    assert "1000 bytes" in str(error) and "100 bytes" in str(error)
    # A result within the limit is recorded as usual.
    small = await idem.run(new_key(), "fp", returns(b"x" * 100))
    assert not small.replayed


@pytest.mark.parametrize("store", ["dynamodb_store_url"], indirect=True)
async def test_a_result_the_store_refuses_as_too_large_is_never_run_again(
    store: IdempotencyStore,
) -> None:
    # DynamoDB's 400 KB item limit, refused by the store itself (random bytes: zlib cannot
    # shrink them under it).
    error = await retry_error_after_one_run(Idempotency(store), new_key(), os.urandom(500_000))
    assert error.size == 500_000 and "500000 bytes" in str(error)
    assert "400 KB" in str(error)


@pytest.mark.parametrize("store", ["memory_store_url", "redis_store_url"], indirect=True)
async def test_a_refusing_store_leaves_the_key_recording_the_size(
    store: IdempotencyStore,
) -> None:
    limited = SizeLimitedStore(store, limit=1000)
    error = await retry_error_after_one_run(Idempotency(limited), new_key(), b"y" * 5000)
    assert error.size == 5000 and error.limit is None
    assert "over the item limit of 1000 bytes" in str(error)


async def test_a_response_that_looks_like_a_marker_round_trips() -> None:
    # The marker can never be mistaken for a real response: one that starts like it is
    # recorded escaped and replayed exactly.
    from idemstore.execution.outcome_markers import MARKER_PREFIX

    async with open_store("memory://") as store:
        idem = Idempotency(store)
        key = new_key()
        lookalike = MARKER_PREFIX + b"too-large\x00{}"
        first = await idem.run(key, "fp", returns(lookalike))
        second = await idem.run(key, "fp", returns(b"other"))
        assert first.value == second.value == lookalike and second.replayed
