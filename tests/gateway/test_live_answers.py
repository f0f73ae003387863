"""``LiveAnswers``: what a duplicate attached to a running original reads (no processes)."""

from __future__ import annotations

import pytest

from idemstore.mcp.live_answers import LiveAnswers
from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from idemstore.mcp.sse_stream import SSEReader

WHERE = ("caller", "key-1")
PROGRESS = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}'
FINAL = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"n":1.0}}'


async def _read(events: object) -> list[bytes]:
    got = []
    async for chunk in events:  # type: ignore[attr-defined]
        got.append(chunk)
    return got


def _messages(chunks: list[bytes]) -> list[dict[str, object]]:
    reader = SSEReader(1 << 20)
    return [event.message() for chunk in chunks for event in reader.feed(chunk)]


async def test_a_late_reader_gets_every_event_from_the_first_then_its_own_final() -> None:
    live = LiveAnswers(1 << 20)
    answer = live.start(WHERE, "fp")
    answer.event(PROGRESS, final=False)
    attached = live.attach(WHERE, "fp")
    assert attached is answer
    answer.event(PROGRESS, final=False)
    answer.event(FINAL, final=True)
    messages = _messages(await _read(attached.events("retry-2")))
    assert [m.get("method") for m in messages] == ["notifications/progress"] * 2 + [None]
    final = messages[-1]
    assert final["id"] == "retry-2"
    assert final["result"] == {"content": [], "n": 1.0, "_meta": {REPLAYED_META_KEY: True}}


def test_the_original_never_waits_for_a_reader_and_another_fingerprint_never_attaches() -> None:
    live = LiveAnswers(1 << 20)
    answer = live.start(WHERE, "fp")
    reader = live.attach(WHERE, "fp")
    assert reader is not None
    # Nobody reads: every event is taken at once (event() is synchronous, nothing queues).
    for _ in range(1000):
        answer.event(PROGRESS, final=False)
    assert live.attach(WHERE, "other-arguments") is None


async def test_an_answer_over_the_limit_takes_no_reader_and_cuts_those_attached() -> None:
    live = LiveAnswers(len(PROGRESS) * 2)
    answer = live.start(WHERE, "fp")
    attached = live.attach(WHERE, "fp")
    assert attached is not None
    for _ in range(3):
        answer.event(PROGRESS, final=False)
    assert live.attach(WHERE, "fp") is None
    with pytest.raises(ConnectionError):
        await _read(attached.events(1))


async def test_an_original_that_ended_without_a_final_response_cuts_its_readers() -> None:
    live = LiveAnswers(1 << 20)
    answer = live.start(WHERE, "fp")
    attached = live.attach(WHERE, "fp")
    assert attached is not None
    live.end(WHERE, answer)
    assert live.attach(WHERE, "fp") is None
    with pytest.raises(ConnectionError):
        await _read(attached.events(1))
