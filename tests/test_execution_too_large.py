"""Issue 28: a result too large for the store never leads to a silent second run.

The key records that its outcome was too large (a marker in place of the response), and every
retry gets ``OutcomeTooLargeError`` naming the size and the limit instead of running again.
"""

from __future__ import annotations

import os
import uuid

import pytest

from idemstore import (
    Idempotency,
    OutcomeTooLargeError,
    ResponseTooLargeError,
    open_store,
)
from idemstore.testing.stores import SizeLimitedStore
from idemstore.testing.work import returns


def new_key() -> str:
    return f"large-{uuid.uuid4().hex[:12]}"


async def _run_twice(idem: Idempotency, key: str, result: bytes) -> tuple[int, BaseException]:
    """Run work returning ``result`` under ``key``, then retry it: (runs, the retry's error)."""
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
    return runs, retry.value


@pytest.mark.parametrize("url_fixture", ["memory_store_url", "sqlite_file_store_url"])
async def test_a_result_over_max_response_bytes_is_never_run_again(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    async with open_store(request.getfixturevalue(url_fixture)) as store:
        idem = Idempotency(store, max_response_bytes=100)
        key = new_key()
        runs, error = await _run_twice(idem, key, b"x" * 1000)
        assert runs == 1
        assert isinstance(error, ResponseTooLargeError)
        assert (error.key, error.size, error.limit) == (key, 1000, 100)
        assert "1000 bytes" in str(error) and "100 bytes" in str(error)
        # A result within the limit is recorded as usual.
        small = await idem.run(new_key(), "fp", returns(b"x" * 100))
        assert not small.replayed


async def test_a_result_the_store_refuses_as_too_large_is_never_run_again(
    dynamodb_store_url: str,
) -> None:
    # DynamoDB's 400 KB item limit, refused by the store itself (random bytes: zlib cannot
    # shrink them under it).
    async with open_store(dynamodb_store_url) as store:
        key = new_key()
        runs, error = await _run_twice(Idempotency(store), key, os.urandom(500_000))
        assert runs == 1
        assert error.size == 500_000 and "500000 bytes" in str(error)
        assert "400 KB" in str(error)


@pytest.mark.parametrize("url_fixture", ["memory_store_url", "redis_store_url"])
async def test_a_refusing_store_leaves_the_key_recording_the_size(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    async with open_store(request.getfixturevalue(url_fixture)) as store:
        limited = SizeLimitedStore(store, limit=1000)
        runs, error = await _run_twice(Idempotency(limited), new_key(), b"y" * 5000)
        assert runs == 1
        assert error.size == 5000 and error.limit is None
        assert "over the item limit of 1000 bytes" in str(error)


async def test_a_response_that_looks_like_a_marker_round_trips() -> None:
    # The marker can never be mistaken for a real response: one that starts like it is
    # recorded escaped and replayed exactly.
    from idemstore.outcome_markers import MARKER_PREFIX

    async with open_store("memory://") as store:
        idem = Idempotency(store)
        key = new_key()
        lookalike = MARKER_PREFIX + b"too-large\x00{}"
        first = await idem.run(key, "fp", returns(lookalike))
        second = await idem.run(key, "fp", returns(b"other"))
        assert first.value == second.value == lookalike and second.replayed
