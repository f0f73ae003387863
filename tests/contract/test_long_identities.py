"""Every identity within the documented limits round-trips on every backend (issue 13,
case 3): a 1,024-character CJK scope with a 255-character key is about 3.8 KB of UTF-8, past
the row size a b-tree index on the raw identity allows on PostgreSQL."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from idemstore import Outcome, Status
from idemstore.records import MAX_KEY_LENGTH, MAX_SCOPE_LENGTH

if TYPE_CHECKING:
    from idemstore import IdempotencyStore

LONG = 60.0


def cjk(length: int, seed: int) -> str:
    """``length`` CJK ideographs in a random order: nothing an engine could compress away
    (PostgreSQL compresses index entries, so a repeated character would fit)."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(length))


async def test_the_longest_cjk_scope_and_key_round_trip(store: IdempotencyStore) -> None:
    scope = cjk(MAX_SCOPE_LENGTH, seed=1)
    key = cjk(MAX_KEY_LENGTH, seed=2)
    first = await store.reserve(key, "fp", scope=scope, lease_ttl=LONG, retention=LONG)
    assert first.outcome is Outcome.ACQUIRED and first.lease is not None
    assert await store.extend(first.lease, lease_ttl=LONG) is not None
    assert await store.complete(first.lease, b"result") is True
    replay = await store.reserve(key, "fp", scope=scope, lease_ttl=LONG, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None
    assert (replay.record.scope, replay.record.key) == (scope, key)
    assert replay.record.response == b"result"
    record = await store.get(key, scope=scope)
    assert record is not None and record.status is Status.COMPLETED
    # A neighbour one character shorter is another identity.
    assert await store.get(key[:-1], scope=scope) is None
    assert await store.delete(key, scope=scope) is True
    assert await store.get(key, scope=scope) is None


async def test_two_long_scopes_differing_in_the_last_character_stay_apart(
    store: IdempotencyStore,
) -> None:
    base = cjk(MAX_SCOPE_LENGTH - 1, seed=3)
    key = cjk(MAX_KEY_LENGTH, seed=4)
    a = await store.reserve(key, "fp", scope=base + "a", lease_ttl=LONG, retention=LONG)
    b = await store.reserve(key, "fp", scope=base + "b", lease_ttl=LONG, retention=LONG)
    assert a.outcome is Outcome.ACQUIRED and b.outcome is Outcome.ACQUIRED
    assert a.lease is not None and b.lease is not None
    assert await store.complete(a.lease, b"a") is True
    assert await store.complete(b.lease, b"b") is True
    got_a = await store.get(key, scope=base + "a")
    got_b = await store.get(key, scope=base + "b")
    assert got_a is not None and got_a.response == b"a"
    assert got_b is not None and got_b.response == b"b"
