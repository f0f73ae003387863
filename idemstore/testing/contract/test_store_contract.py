"""SEMANTICS.md sections 1-5, one behaviour per test, on every backend."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from idemstore import (
    ConfigurationError,
    IdempotencyStore,
    InvalidKeyError,
    Outcome,
    Status,
)

# Short leases and retentions make expiry observable in a test; SLACK is how long past a
# deadline we sleep so that a busy machine still sees it passed.
SHORT = 0.3
SLACK = 0.25
LONG = 60.0
# BRIEF is short too, but longer than a reply can take on a loaded machine (moto's can take
# more than SHORT): for what must still hold a round trip or two after it was granted, and for
# a runner, which refuses a grant whose reply came after the lease could have lapsed.
BRIEF = 1.0
FP = "fp-a"
OTHER_FP = "fp-b"


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


async def acquire(store: IdempotencyStore, key: str, *, lease_ttl: float = LONG, **kw: object):  # type: ignore[no-untyped-def]
    reservation = await store.reserve(key, FP, lease_ttl=lease_ttl, retention=LONG, **kw)  # type: ignore[arg-type]
    assert reservation.outcome is Outcome.ACQUIRED
    assert reservation.lease is not None
    return reservation.lease


def test_store_satisfies_the_protocol(store: IdempotencyStore) -> None:
    assert isinstance(store, IdempotencyStore)


async def test_ping_answers(store: IdempotencyStore) -> None:
    await store.ping()


async def test_first_reserve_acquires_with_fence_one(store: IdempotencyStore) -> None:
    key = new_key()
    reservation = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED
    assert reservation.takeover is False
    assert reservation.record is None
    lease = reservation.lease
    assert lease is not None
    assert (lease.scope, lease.key, lease.fence) == ("", key, 1)
    assert len(lease.token) >= 32
    record = await store.get(key)
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.fingerprint == FP
    assert record.token == lease.token
    assert record.response is None
    assert record.lease_expires_at is not None
    assert record.created_at <= record.lease_expires_at <= record.expires_at


async def test_concurrent_reserves_on_one_key_acquire_exactly_once(store: IdempotencyStore) -> None:
    key = new_key()
    results = await asyncio.gather(
        *(store.reserve(key, FP, lease_ttl=LONG, retention=LONG) for _ in range(100))
    )
    outcomes = [r.outcome for r in results]
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 99
    holder = next(r.lease for r in results if r.lease is not None)
    assert all(r.record is not None and r.record.token == holder.token for r in results if r.record)


async def test_live_lease_reports_in_progress_with_the_record(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.IN_PROGRESS
    assert again.lease is None
    assert again.record is not None
    assert again.record.token == lease.token
    assert again.record.status is Status.IN_PROGRESS


async def test_completed_key_replays_the_stored_response(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.complete(lease, b'{"charged": 42}') is True
    replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.lease is None
    assert replay.record is not None
    assert replay.record.status is Status.COMPLETED
    assert replay.record.response == b'{"charged": 42}'
    assert replay.record.fence == lease.fence
    assert replay.record.lease_expires_at is None


async def test_takeover_after_lease_expiry_raises_fence_and_flags_takeover(
    store: IdempotencyStore,
) -> None:
    key = new_key()
    first = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    second = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert second.outcome is Outcome.ACQUIRED
    assert second.takeover is True
    assert second.lease is not None
    assert second.lease.fence == first.fence + 1
    assert second.lease.token != first.token


async def test_stale_owner_cannot_complete_after_takeover(store: IdempotencyStore) -> None:
    key = new_key()
    stale = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    fresh = await acquire(store, key)
    assert await store.complete(stale, b"stale") is False
    record = await store.get(key)
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.token == fresh.token
    assert record.response is None


async def test_stale_owner_cannot_release_after_takeover(store: IdempotencyStore) -> None:
    key = new_key()
    stale = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    fresh = await acquire(store, key)
    assert await store.release(stale) is False
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.IN_PROGRESS
    assert again.record is not None and again.record.token == fresh.token


async def test_stale_owner_cannot_extend_after_takeover(store: IdempotencyStore) -> None:
    key = new_key()
    stale = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    fresh = await acquire(store, key, lease_ttl=LONG)
    before = await store.get(key)
    assert await store.extend(stale, lease_ttl=LONG) is None
    after = await store.get(key)
    assert before is not None and after is not None
    assert after.token == fresh.token
    assert after.lease_expires_at == before.lease_expires_at


async def test_complete_needs_the_same_fence_not_only_the_token(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    forged = type(lease)(lease.scope, lease.key, lease.token, lease.fence + 1, 0.0, LONG)
    assert await store.complete(forged, b"x") is False
    assert await store.release(forged) is False
    assert await store.extend(forged, lease_ttl=LONG) is None
    assert await store.complete(lease, b"ok") is True


async def test_expired_lease_nobody_took_over_may_still_complete(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    assert await store.complete(lease, b"late but fine") is True
    record = await store.get(key)
    assert record is not None and record.response == b"late but fine"


async def test_completed_record_cannot_be_completed_again(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.complete(lease, b"first") is True
    assert await store.complete(lease, b"second") is False
    assert await store.release(lease) is False
    record = await store.get(key)
    assert record is not None and record.response == b"first"


async def test_mismatch_on_live_lease_returns_the_record(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    other = await store.reserve(key, OTHER_FP, lease_ttl=LONG, retention=LONG)
    assert other.outcome is Outcome.MISMATCH
    assert other.lease is None
    assert other.record is not None and other.record.token == lease.token


async def test_mismatch_on_completed_record_returns_the_record(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    await store.complete(lease, b"done")
    other = await store.reserve(key, OTHER_FP, lease_ttl=LONG, retention=LONG)
    assert other.outcome is Outcome.MISMATCH
    assert other.record is not None and other.record.response == b"done"


async def test_mismatch_never_takes_over_an_expired_lease(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key, lease_ttl=SHORT)
    await asyncio.sleep(SHORT + SLACK)
    other = await store.reserve(key, OTHER_FP, lease_ttl=LONG, retention=LONG)
    assert other.outcome is Outcome.MISMATCH
    assert await store.complete(lease, b"still mine") is True


async def test_release_makes_the_key_reservable_at_once(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.release(lease) is True
    assert await store.get(key) is None
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.ACQUIRED
    assert again.takeover is False


async def test_fence_rises_across_release(store: IdempotencyStore) -> None:
    key = new_key()
    fences = []
    for _ in range(3):
        lease = await acquire(store, key)
        fences.append(lease.fence)
        assert await store.release(lease) is True
    assert fences == sorted(set(fences))
    assert fences[0] >= 1


async def test_released_key_may_be_reserved_with_other_arguments(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    await store.release(lease)
    other = await store.reserve(key, OTHER_FP, lease_ttl=LONG, retention=LONG)
    assert other.outcome is Outcome.ACQUIRED
    assert other.lease is not None and other.lease.fence > lease.fence


async def test_extend_pushes_the_lease_deadline(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key, lease_ttl=BRIEF)
    extended = await store.extend(lease, lease_ttl=LONG)
    assert extended is not None
    assert (extended.token, extended.fence) == (lease.token, lease.fence)
    assert extended.lease_expires_at > lease.lease_expires_at
    await asyncio.sleep(BRIEF + SLACK)
    again = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert again.outcome is Outcome.IN_PROGRESS
    assert await store.complete(extended, b"ok") is True


async def test_complete_uses_the_retention_it_is_given(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.complete(lease, b"short-lived", retention=BRIEF) is True
    assert await store.get(key) is not None
    await asyncio.sleep(BRIEF + SLACK)
    assert await store.get(key) is None


async def test_retention_expiry_hides_a_record_before_sweep(store: IdempotencyStore) -> None:
    key = new_key()
    reservation = await store.reserve(key, FP, lease_ttl=SHORT, retention=SHORT)
    assert reservation.lease is not None
    await store.complete(reservation.lease, b"gone soon")
    await asyncio.sleep(SHORT + SLACK)
    assert await store.get(key) is None
    fresh = await store.reserve(key, OTHER_FP, lease_ttl=LONG, retention=LONG)
    assert fresh.outcome is Outcome.ACQUIRED
    assert fresh.lease is not None and fresh.lease.fence >= 1


async def test_sweep_removes_records_past_retention(store: IdempotencyStore) -> None:
    keys = [new_key() for _ in range(3)]
    for key in keys:
        r = await store.reserve(key, FP, lease_ttl=SHORT, retention=SHORT)
        assert r.lease is not None
        await store.complete(r.lease, b"x")
    await asyncio.sleep(SHORT + SLACK)
    removed = 0
    for _ in range(10):
        removed += await store.sweep(limit=1000)
        if removed >= 3:
            break
    assert removed >= 3
    assert await store.sweep(limit=1000) == 0


async def test_sweep_never_removes_a_live_record(store: IdempotencyStore) -> None:
    completed, running, expired = new_key(), new_key(), new_key()
    lease = await acquire(store, completed)
    await store.complete(lease, b"keep me")
    await acquire(store, running)
    doomed = await store.reserve(expired, FP, lease_ttl=SHORT, retention=SHORT)
    assert doomed.lease is not None
    await asyncio.sleep(SHORT + SLACK)
    await store.sweep(limit=1000)
    kept = await store.get(completed)
    assert kept is not None and kept.response == b"keep me"
    held = await store.get(running)
    assert held is not None and held.status is Status.IN_PROGRESS


async def test_sweep_rejects_a_non_positive_limit(store: IdempotencyStore) -> None:
    with pytest.raises(ConfigurationError):
        await store.sweep(limit=0)


async def test_scopes_are_isolated(store: IdempotencyStore) -> None:
    key = new_key()
    alice = await acquire(store, key, scope="alice")
    await store.complete(alice, b"alice's")
    bob = await store.reserve(key, OTHER_FP, scope="bob", lease_ttl=LONG, retention=LONG)
    assert bob.outcome is Outcome.ACQUIRED
    assert await store.get(key) is None
    alice_record = await store.get(key, scope="alice")
    assert alice_record is not None and alice_record.response == b"alice's"
    assert alice_record.scope == "alice"
    assert bob.lease is not None
    assert await store.delete(key, scope="bob") is True
    assert await store.get(key, scope="alice") is not None


async def test_scope_and_key_do_not_run_together(store: IdempotencyStore) -> None:
    # ("a:b", "c") and ("a", "b:c") must be different records whatever the key layout.
    one = await acquire(store, "b:c", scope="a")
    await store.complete(one, b"one")
    two = await store.reserve("c", FP, scope="a:b", lease_ttl=LONG, retention=LONG)
    assert two.outcome is Outcome.ACQUIRED


@pytest.mark.parametrize(
    "bad_key",
    ["", "k" * 256, "nul\x00inside", "lone\ud800surrogate", 42],
    ids=["empty", "too-long", "nul", "lone-surrogate", "not-a-string"],
)
async def test_invalid_keys_are_rejected(store: IdempotencyStore, bad_key: object) -> None:
    with pytest.raises(InvalidKeyError):
        await store.reserve(bad_key, FP, lease_ttl=LONG, retention=LONG)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        await store.get(bad_key)  # type: ignore[arg-type]


async def test_invalid_scope_and_fingerprint_are_rejected(store: IdempotencyStore) -> None:
    with pytest.raises(InvalidKeyError):
        await store.reserve(new_key(), FP, scope="a\x00b", lease_ttl=LONG, retention=LONG)
    with pytest.raises(InvalidKeyError):
        await store.reserve(new_key(), "f" * 129, lease_ttl=LONG, retention=LONG)
    with pytest.raises(InvalidKeyError):
        await store.reserve(new_key(), "", lease_ttl=LONG, retention=LONG)


async def test_non_positive_durations_are_rejected(store: IdempotencyStore) -> None:
    with pytest.raises(ConfigurationError):
        await store.reserve(new_key(), FP, lease_ttl=0, retention=LONG)
    with pytest.raises(ConfigurationError):
        await store.reserve(new_key(), FP, lease_ttl=LONG, retention=float("nan"))


async def test_longest_valid_key_is_accepted(store: IdempotencyStore) -> None:
    key = "\U0001f600" * 255
    lease = await acquire(store, key)
    assert lease.key == key


@pytest.mark.parametrize(
    "key",
    [
        "caf\u00e9",
        "cafe\u0301",
        "\U0001f600-emoji",
        "\u4e2d\u6587",
        "space and\ttab",
        "{hash}tag",
        "' OR 1=1 --",
        "-- lua ]]",
    ],
)
async def test_unicode_keys_round_trip_exactly(store: IdempotencyStore, key: str) -> None:
    lease = await acquire(store, key + new_key())
    assert await store.complete(lease, b"ok")
    record = await store.get(lease.key)
    assert record is not None
    assert record.key == lease.key


@pytest.mark.parametrize(
    "response",
    [b"", b"\x00\xff\x00binary\r\n", bytes(range(256)) * 40, "h\u00e9llo".encode()],
    ids=["empty", "nul-and-high-bytes", "10kB-all-bytes", "utf8"],
)
async def test_binary_responses_round_trip_exactly(
    store: IdempotencyStore, response: bytes
) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.complete(lease, response)
    record = await store.get(key)
    assert record is not None
    assert record.response == response
    assert isinstance(record.response, bytes)
    replay = await store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert replay.record is not None and replay.record.response == response


async def test_wait_wakes_promptly_on_complete(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)

    async def finish() -> None:
        await asyncio.sleep(0.1)
        await store.complete(lease, b"done")

    started = time.monotonic()
    finisher = asyncio.create_task(finish())
    record = await store.wait(key, timeout=10)
    elapsed = time.monotonic() - started
    await finisher
    assert record is not None and record.status is Status.COMPLETED
    assert record.response == b"done"
    # Woken by the completion, not by the 10 s timeout.
    assert elapsed < 5


async def test_wait_wakes_promptly_on_release(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)

    async def give_up() -> None:
        await asyncio.sleep(0.1)
        await store.release(lease)

    started = time.monotonic()
    releaser = asyncio.create_task(give_up())
    record = await store.wait(key, timeout=10)
    await releaser
    assert record is None
    assert time.monotonic() - started < 5


async def test_wait_returns_when_the_lease_lapses(store: IdempotencyStore) -> None:
    key = new_key()
    await acquire(store, key, lease_ttl=SHORT)
    started = time.monotonic()
    record = await store.wait(key, timeout=10)
    assert time.monotonic() - started < 5
    assert record is not None and record.status is Status.IN_PROGRESS


async def test_wait_times_out_with_the_current_record(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    record = await store.wait(key, timeout=0.2)
    assert record is not None and record.token == lease.token


async def test_wait_on_an_absent_key_returns_none_at_once(store: IdempotencyStore) -> None:
    started = time.monotonic()
    assert await store.wait(new_key(), timeout=10) is None
    assert time.monotonic() - started < 5


async def test_delete_removes_a_record_whatever_its_state(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    assert await store.delete(key) is True
    assert await store.get(key) is None
    assert await store.delete(key) is False
    assert await store.complete(lease, b"after delete") is False
    assert await store.get(key) is None


@pytest.mark.parametrize("bad_limit", [True, 2.5, "5", -1], ids=["bool", "float", "str", "neg"])
async def test_sweep_rejects_a_limit_that_is_not_a_positive_int(
    store: IdempotencyStore, bad_limit: object
) -> None:
    with pytest.raises(ConfigurationError):
        await store.sweep(limit=bad_limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad_timeout", [float("nan"), -1, True, "1", None], ids=["nan", "neg", "bool", "str", "none"]
)
async def test_wait_rejects_a_timeout_that_is_not_a_number_of_seconds(
    store: IdempotencyStore, bad_timeout: object
) -> None:
    with pytest.raises(ConfigurationError):
        await store.wait(new_key(), timeout=bad_timeout)  # type: ignore[arg-type]


async def test_wait_with_zero_timeout_returns_the_current_record(store: IdempotencyStore) -> None:
    key = new_key()
    lease = await acquire(store, key)
    record = await store.wait(key, timeout=0)
    assert record is not None and record.token == lease.token


async def test_durations_over_a_century_are_refused_before_anything_is_written(
    store: IdempotencyStore,
) -> None:
    key = new_key()
    with pytest.raises(ConfigurationError):
        await store.reserve(key, FP, lease_ttl=LONG, retention=1e11)
    assert await store.get(key) is None
    lease = await acquire(store, key)
    with pytest.raises(ConfigurationError):
        await store.complete(lease, b"x", retention=1e11)
    with pytest.raises(ConfigurationError):
        await store.extend(lease, lease_ttl=1e11)
    assert await store.complete(lease, b"ok") is True
