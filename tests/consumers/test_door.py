"""The consumer door's rules, on a fake delivery and a memory store."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from idemstore import Idempotency, current_execution
from idemstore.consumers import ConsumerDoor, Disposition, Message, attribute, body_pointer
from idemstore.consumers.door import handle_all
from tests.consumers.conftest import FakeDelivery, PausedHeartbeats

if TYPE_CHECKING:
    from idemstore import IdempotencyStore


def message(body: Any = None, *, id: str = "m-1", **attributes: str) -> Message:
    data = json.dumps({"order": "o-1"} if body is None else body).encode()
    return Message(id=id, body=data, attributes=attributes)


class Counter:
    def __init__(self, result: Any = "done", *, sleep: float = 0.0, fail: int = 0) -> None:
        self.runs: list[str] = []
        self.result = result
        self.sleep = sleep
        self.fail = fail

    async def __call__(self, msg: Message) -> Any:
        self.runs.append(msg.id)
        if self.sleep:
            await asyncio.sleep(self.sleep)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("handler failed")
        return self.result


async def test_a_new_message_runs_then_is_acked(store: IdempotencyStore) -> None:
    door = ConsumerDoor(Idempotency(store))
    handler, delivery = Counter(), FakeDelivery(message())
    assert await door.handle(delivery, handler) is Disposition.PROCESSED
    assert handler.runs == ["m-1"]
    assert delivery.said() == ["ack"]


async def test_a_redelivery_is_acked_without_running_and_gets_the_recorded_result(
    store: IdempotencyStore,
) -> None:
    seen: list[tuple[str, Any]] = []
    door = ConsumerDoor(
        Idempotency(store), on_duplicate=lambda msg, value: seen.append((msg.id, value))
    )
    handler = Counter({"charged": 5})
    await door.handle(FakeDelivery(message()), handler)
    again = FakeDelivery(message())
    assert await door.handle(again, handler) is Disposition.REPLAYED
    assert handler.runs == ["m-1"]
    assert again.said() == ["ack"]
    assert seen == [("m-1", {"charged": 5})]


async def test_a_delivery_whose_key_another_consumer_holds_goes_back_unacked(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store), busy_delay=2.5)
    slow = Counter(sleep=0.2)
    first = asyncio.create_task(door.handle(FakeDelivery(message()), slow))
    await asyncio.sleep(0.05)
    second = FakeDelivery(message())
    assert await door.handle(second, slow) is Disposition.BUSY
    assert second.calls == [("retry_later", 2.5)]
    assert await first is Disposition.PROCESSED
    assert slow.runs == ["m-1"]


async def test_concurrent_deliveries_of_one_key_run_the_handler_once(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store), busy_delay=0)
    handler = Counter(sleep=0.01)
    pending = [message(id="same") for _ in range(20)]
    while pending:
        deliveries = [FakeDelivery(m) for m in pending]
        results = await asyncio.gather(*(door.handle(d, handler) for d in deliveries))
        pending = [
            d.message for d, r in zip(deliveries, results, strict=True) if r is Disposition.BUSY
        ]
    assert handler.runs == ["same"]


async def test_a_failed_handler_releases_the_key_and_the_message_runs_again(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store), failure_delay=0.5)
    handler = Counter(fail=1)
    failed = FakeDelivery(message())
    assert await door.handle(failed, handler) is Disposition.FAILED
    assert failed.calls == [("retry_later", 0.5)]
    assert await door.handle(FakeDelivery(message()), handler) is Disposition.PROCESSED
    assert handler.runs == ["m-1", "m-1"]


async def test_under_hold_a_failed_message_stays_busy_until_the_lease_lapses(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store, on_failure="hold", lease_ttl=0.3))
    handler = Counter(fail=1)
    assert await door.handle(FakeDelivery(message()), handler) is Disposition.FAILED
    assert await door.handle(FakeDelivery(message()), handler) is Disposition.BUSY
    await asyncio.sleep(0.35)
    assert await door.handle(FakeDelivery(message()), handler) is Disposition.PROCESSED
    assert handler.runs == ["m-1", "m-1"]


async def test_a_takeover_under_refuse_dead_letters_and_never_runs_again(
    store: IdempotencyStore,
) -> None:
    idem = Idempotency(store, on_takeover="refuse", lease_ttl=0.2)
    door = ConsumerDoor(idem)
    # A consumer that reserved the key and died: its lease lapses, no outcome.
    await store.reserve(
        "m-1", door.fingerprint(message()), scope="consumer", lease_ttl=0.2, retention=60
    )
    await asyncio.sleep(0.25)
    handler, delivery = Counter(), FakeDelivery(message())
    assert await door.handle(delivery, handler) is Disposition.DEAD_LETTERED
    assert delivery.said() == ["dead_letter"]
    assert handler.runs == []


async def test_a_takeover_under_run_runs_again_and_says_so(store: IdempotencyStore) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=0.2))
    await store.reserve(
        "m-1", door.fingerprint(message()), scope="consumer", lease_ttl=0.2, retention=60
    )
    await asyncio.sleep(0.25)
    takeovers: list[bool] = []

    async def handler(msg: Message) -> str:
        execution = current_execution()
        assert execution is not None
        takeovers.append(execution.takeover)
        return "ok"

    assert await door.handle(FakeDelivery(message()), handler) is Disposition.PROCESSED
    assert takeovers == [True]


async def test_the_same_key_with_another_body_is_dead_lettered(store: IdempotencyStore) -> None:
    door = ConsumerDoor(Idempotency(store))
    handler = Counter()
    await door.handle(FakeDelivery(message({"order": "o-1"})), handler)
    other = FakeDelivery(message({"order": "o-2"}))
    assert await door.handle(other, handler) is Disposition.DEAD_LETTERED
    assert handler.runs == ["m-1"]


async def test_a_key_from_the_body_makes_two_messages_of_one_event_run_once(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(
        Idempotency(store), key=body_pointer("/event/id"), fingerprint_exclude=["/sent_at"]
    )
    handler = Counter()
    first = message({"event": {"id": "e-7"}, "sent_at": 1}, id="m-1")
    second = message({"event": {"id": "e-7"}, "sent_at": 2}, id="m-2")
    assert await door.handle(FakeDelivery(first), handler) is Disposition.PROCESSED
    assert await door.handle(FakeDelivery(second), handler) is Disposition.REPLAYED
    assert handler.runs == ["m-1"]


async def test_a_key_from_an_attribute_is_read_case_insensitively(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store), key=attribute("Idempotency-Key"))
    handler = Counter()
    await door.handle(FakeDelivery(message(id="m-1", **{"idempotency-key": "k"})), handler)
    replay = await door.handle(FakeDelivery(message(id="m-2", **{"IDEMPOTENCY-KEY": "k"})), handler)
    assert replay is Disposition.REPLAYED
    assert handler.runs == ["m-1"]


async def test_a_message_without_a_key_is_dead_lettered_unrun(store: IdempotencyStore) -> None:
    door = ConsumerDoor(Idempotency(store), key=body_pointer("/event/id"))
    handler, delivery = Counter(), FakeDelivery(message({"other": 1}))
    assert await door.handle(delivery, handler) is Disposition.DEAD_LETTERED
    assert handler.runs == []
    no_id = FakeDelivery(Message(id="", body=b"{}"))
    assert (
        await ConsumerDoor(Idempotency(store)).handle(no_id, handler) is Disposition.DEAD_LETTERED
    )


async def test_a_long_handler_keeps_its_message_at_the_heartbeat_cadence(
    store: IdempotencyStore,
) -> None:
    door = ConsumerDoor(Idempotency(store, lease_ttl=0.3))
    delivery = FakeDelivery(message())
    assert await door.handle(delivery, Counter(sleep=0.7)) is Disposition.PROCESSED
    keeps = [seconds for name, seconds in delivery.calls if name == "keep"]
    assert len(keeps) >= 3
    assert set(keeps) == {0.3}
    assert delivery.calls[-1] == ("ack", None)


async def test_a_handler_fenced_out_by_a_takeover_neither_acks_nor_records(
    store: IdempotencyStore,
) -> None:
    # The first consumer is paused past its lease (its heartbeats hang); a second takes the
    # key over and records its own outcome.
    paused = PausedHeartbeats(store)
    door = ConsumerDoor(Idempotency(paused, lease_ttl=0.2))
    stalled, woken = FakeDelivery(message()), asyncio.Event()

    async def slow(msg: Message) -> str:
        await woken.wait()
        return "late"

    first = asyncio.create_task(door.handle(stalled, slow))
    await asyncio.sleep(0.3)
    taker = FakeDelivery(message())
    assert await door.handle(taker, Counter("taken")) is Disposition.PROCESSED
    woken.set()
    assert await first is Disposition.FENCED_OUT
    assert stalled.said() == ["leave"]
    record = await store.get("m-1", scope="consumer")
    assert record is not None and record.response is not None and b"taken" in record.response


async def test_a_failing_ack_is_an_error_of_its_message_alone(store: IdempotencyStore) -> None:
    class AckFails(FakeDelivery):
        async def ack(self) -> None:
            raise ConnectionError("broker gone")

    door = ConsumerDoor(Idempotency(store))
    handler = Counter()
    broken, fine = AckFails(message(id="m-1")), FakeDelivery(message(id="m-2"))
    outcomes = await handle_all(door, [broken, fine], handler)
    assert outcomes == [Disposition.ERROR, Disposition.PROCESSED]
    # The outcome was recorded before the ack failed: the redelivery replays.
    assert await door.handle(FakeDelivery(message(id="m-1")), handler) is Disposition.REPLAYED
    assert handler.runs == ["m-1", "m-2"]


async def test_a_failing_on_duplicate_hook_still_acks_the_duplicate(
    store: IdempotencyStore,
) -> None:
    def hook(msg: Message, value: Any) -> None:
        raise RuntimeError("hook bug")

    door = ConsumerDoor(Idempotency(store), on_duplicate=hook)
    await door.handle(FakeDelivery(message()), Counter())
    again = FakeDelivery(message())
    assert await door.handle(again, Counter()) is Disposition.REPLAYED
    assert again.said() == ["ack"]
