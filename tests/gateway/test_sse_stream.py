"""The gateway's event-stream reader keeps every byte and splits events wherever chunks end."""

from __future__ import annotations

import pytest

from idemstore.mcp.sse_stream import SSEReader, render_event

STREAM = (
    b": a comment\r\n\r\n"
    b'id: 1\r\nevent: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
    b'data: {"b": 2}\r\r'
    b"retry: 10\nevent: other\ndata: x\n\n"
)


def _read(chunks: list[bytes]) -> list[tuple[bytes, str | None, str | None, str | None]]:
    reader = SSEReader(1 << 20)
    events = [e for chunk in chunks for e in reader.feed(chunk)]
    assert reader.pending() == b""
    return [(e.raw, e.data, e.event, e.id) for e in events]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, len(STREAM)])
def test_events_and_their_bytes_do_not_depend_on_where_chunks_end(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    events = _read(chunks)
    assert b"".join(raw for raw, *_ in events) == STREAM  # relayed byte for byte
    assert [(data, event, id_) for _, data, event, id_ in events] == [
        (None, None, None),
        ('{"a":\n1}', "message", "1"),
        ('{"b": 2}', None, None),
        ("x", "other", None),
    ]


def test_only_message_events_carry_json_rpc() -> None:
    reader = SSEReader(1 << 20)
    (ours, theirs) = reader.feed(render_event(b'{"id":1}', event_id="7") + STREAM[-34:])
    assert ours.message() == {"id": 1} and ours.id == "7"
    assert theirs.event == "other" and theirs.message() is None


def test_an_event_over_the_limit_is_refused() -> None:
    reader = SSEReader(64)
    with pytest.raises(ValueError, match="longer than 64 bytes"):
        reader.feed(b"data: " + b"x" * 100)
