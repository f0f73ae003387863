"""Server-sent events as the gateway relays them: split as they arrive, keeping their bytes.

The gateway passes every event through as the upstream wrote it, and only needs to *look* at
each one (is this the final response to the call?). ``SSEReader`` therefore yields each event
with its exact bytes beside the fields it parsed, following the WHATWG event-stream rules:
lines end in CRLF, LF or CR; a blank line ends an event; ``data`` lines join with ``\\n``;
comments (``:``) and unknown fields are kept in the bytes but carry no meaning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEReader", "render_event"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: ``raw`` is byte for byte what the stream held, blank line included.

    ``data`` is ``None`` when the event had no ``data`` line (a comment or a bare ``id``).
    """

    raw: bytes
    data: str | None
    event: str | None
    id: str | None

    def message(self) -> object:
        """The ``data`` decoded as JSON, or ``None`` when it is absent or not JSON."""
        if self.data is None or self.event not in (None, "message"):
            return None
        try:
            return json.loads(self.data)
        except (ValueError, RecursionError):
            return None


class SSEReader:
    """Feed chunks as they arrive; get back the events they complete.

    ``max_event_bytes`` bounds one event: a longer one raises ``ValueError`` (a stream that
    never ends an event must not grow the gateway's memory without bound).
    """

    __slots__ = ("_buffer", "_data", "_event", "_id", "_limit", "_raw")

    def __init__(self, max_event_bytes: int) -> None:
        self._limit = max_event_bytes
        self._buffer = bytearray()
        self._raw = bytearray()
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events ``chunk`` completes, in order."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            end, width = self._line_end()
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            self._raw += self._buffer[: end + width]
            del self._buffer[: end + width]
            if not line:
                event = self._dispatch()
                if event is not None:
                    events.append(event)
            else:
                self._field(line.decode("utf-8", errors="replace"))
        if len(self._raw) + len(self._buffer) > self._limit:
            raise ValueError(f"an event-stream event is longer than {self._limit} bytes")
        return events

    def pending(self) -> bytes:
        """The bytes of an event the stream has not finished (a cut stream leaves them)."""
        return bytes(self._raw + self._buffer)

    def _line_end(self) -> tuple[int, int]:
        """Index and width of the first line ending; ``(-1, 0)`` when none is complete yet."""
        buffer = self._buffer
        lf = buffer.find(b"\n")
        cr = buffer.find(b"\r", 0, lf if lf >= 0 else len(buffer))
        if cr < 0:
            return (lf, 1) if lf >= 0 else (-1, 0)
        if cr + 1 == len(buffer):
            return (-1, 0)  # a CR that may be the first half of a CRLF split across chunks
        return (cr, 2) if buffer[cr + 1] == 0x0A else (cr, 1)

    def _field(self, line: str) -> None:
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value

    def _dispatch(self) -> SSEEvent | None:
        raw, self._raw = bytes(self._raw), bytearray()
        data = "\n".join(self._data) if self._data else None
        event = SSEEvent(raw=raw, data=data, event=self._event, id=self._id)
        self._data, self._event = [], None
        # ``id`` persists across events in the spec (it is the last event id); per event here.
        self._id = None
        return event if raw.strip() else None


def render_event(data: bytes, *, event_id: str | None = None) -> bytes:
    """One ``message`` event carrying ``data`` (a JSON text without newlines)."""
    head = b"" if event_id is None else b"id: " + event_id.encode("utf-8") + b"\n"
    return head + b"event: message\ndata: " + data + b"\n\n"
