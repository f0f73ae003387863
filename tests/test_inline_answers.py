"""A store that declares ``answers_inline`` keeps its word: no operation the execution path
awaits in place (reserve, complete, release, extend) ever suspends.

The execution path trusts the declaration (``idemstore.protocol.answers_inline``): it awaits
those calls without the task that would otherwise protect them from a cancellation, so a call
that suspended anyway could be cut short between taking a key and handing over its lease.
Each call here is driven by hand, one step, and must be finished after it, in every branch.
The memory store declares it, and so does ``instrument()``'s wrapper around it; a subclass or
a forwarding wrapper must declare it itself, since it may add a step that suspends.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from idemstore import Outcome
from idemstore.backends.memory import MemoryStore
from idemstore.protocol import answers_inline
from idemstore.telemetry.instruments import Instruments
from idemstore.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from idemstore import IdempotencyStore, Lease

T = TypeVar("T")
FP = "fp-inline"
LONG = 60.0


def finished_in_one_step(call: Coroutine[Any, Any, T]) -> T:
    """The result of ``call``, which must return without suspending even once."""
    try:
        yielded = call.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    call.close()
    raise AssertionError(f"a store that declares answers_inline suspended on {yielded!r}")


@pytest.fixture(params=["memory", "instrumented memory"])
def store(request: pytest.FixtureRequest) -> IdempotencyStore:
    memory = MemoryStore()
    if request.param == "memory":
        return memory
    return Instruments(None, None, False).wrap(memory)


def acquire(store: IdempotencyStore, key: str) -> Lease:
    reservation = finished_in_one_step(store.reserve(key, FP, lease_ttl=LONG, retention=LONG))
    assert reservation.outcome is Outcome.ACQUIRED and reservation.lease is not None
    return reservation.lease


def test_the_store_declares_inline_answers(store: IdempotencyStore) -> None:
    assert answers_inline(store)


def test_every_reserve_outcome_is_answered_without_suspending(store: IdempotencyStore) -> None:
    key = f"inline-{uuid.uuid4().hex}"
    lease = acquire(store, key)
    held = store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert finished_in_one_step(held).outcome is Outcome.IN_PROGRESS
    other = store.reserve(key, "fp-other", lease_ttl=LONG, retention=LONG)
    assert finished_in_one_step(other).outcome is Outcome.MISMATCH
    assert finished_in_one_step(store.complete(lease, b"done")) is True
    replay = store.reserve(key, FP, lease_ttl=LONG, retention=LONG)
    assert finished_in_one_step(replay).outcome is Outcome.COMPLETED


def test_extend_release_and_fenced_out_calls_finish_without_suspending(
    store: IdempotencyStore,
) -> None:
    key = f"inline-{uuid.uuid4().hex}"
    lease = acquire(store, key)
    extended = finished_in_one_step(store.extend(lease, lease_ttl=LONG))
    assert extended is not None
    assert finished_in_one_step(store.release(extended)) is True
    # The released lease is fenced out now: refusals are answered inline too.
    assert finished_in_one_step(store.complete(extended, b"late")) is False
    assert finished_in_one_step(store.release(extended)) is False
    assert finished_in_one_step(store.extend(extended, lease_ttl=LONG)) is None
    assert acquire(store, key).fence == lease.fence + 1


def test_a_takeover_and_a_lease_copy_are_answered_without_suspending() -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    first = finished_in_one_step(store.reserve("k", FP, lease_ttl=1, retention=LONG))
    assert first.lease is not None
    clock.advance(2)  # the lease lapsed: the next reserve takes the key over
    second = finished_in_one_step(store.reserve("k", FP, lease_ttl=LONG, retention=LONG))
    assert second.outcome is Outcome.ACQUIRED and second.takeover and second.lease is not None
    # An equal lease that is not the object the store handed out takes the checked path.
    copy = dataclasses.replace(second.lease)
    assert copy is not second.lease
    assert finished_in_one_step(store.complete(first.lease, b"stale")) is False
    assert finished_in_one_step(store.complete(copy, b"done")) is True


def test_only_a_declaration_on_the_class_itself_counts() -> None:
    class Audited(MemoryStore):
        # A subclass may add a step that suspends (a log write): it inherits no promise.
        __slots__ = ()

    class Forwarding:
        def __init__(self, wrapped: object) -> None:
            self.wrapped = wrapped

        def __getattr__(self, name: str) -> object:
            return getattr(self.wrapped, name)

    class SaysYes:
        answers_inline = "yes"  # not True: not a declaration

    assert answers_inline(MemoryStore())
    assert not answers_inline(Audited())
    assert not answers_inline(Forwarding(MemoryStore()))
    assert not answers_inline(SaysYes())
    assert not answers_inline(object())
