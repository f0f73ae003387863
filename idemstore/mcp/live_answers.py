"""Attaching a duplicate ``tools/call`` to its original's answer while it still streams.

A duplicate that arrives at the gateway process where the original's streamed (SSE) answer is
still being produced gets that answer live, from its first event, instead of an
"in progress" refusal or a wait for the record: ``LiveAnswers.attach`` finds the original by
caller scope, key and fingerprint. Every event of the original is kept once, in arrival
order, up to ``limit`` bytes (what the gateway would record of an answer); each attached
reader walks that list at its own pace, so a slow reader never slows the original's client
(the original only appends and wakes). An answer over the limit takes no new readers, and
cuts those attached (their retry then gets what the key recorded, or its refusal).

The final response reaches an attached reader as a replay does: with the reader's own
JSON-RPC id and the replay marker, the upstream's bytes otherwise untouched. Across gateway
replicas nothing is attached: a duplicate there waits for the record or is refused, per the
key's policy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from idemstore.mcp import json_splice, sep3182
from idemstore.mcp.sse_stream import render_event
from idemstore.mcp.tool_call_keys import dumps

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["LiveAnswer", "LiveAnswers", "Where"]

Where = tuple[str, str]
"""A call's place among live answers: (its records' scope, its key)."""


class LiveAnswer:
    """One original's streamed answer, kept for the duplicates attached to it."""

    __slots__ = ("_changed", "_cut", "_done", "_events", "_final", "_size", "fingerprint", "limit")

    def __init__(self, fingerprint: str, limit: int) -> None:
        self.fingerprint = fingerprint
        self.limit = limit
        self._events: list[bytes] = []  # the data of each event before the final response
        self._final: bytes | None = None  # the final response's record (no jsonrpc, no id)
        self._size = 0
        self._done = False
        self._cut = False
        self._changed = asyncio.Event()

    @property
    def open(self) -> bool:
        """Whether a duplicate may still attach: the answer goes on and fits the limit."""
        return not self._done and not self._cut

    def event(self, data: bytes, *, final: bool) -> None:
        """The original's next event (its ``data``); ``final``: the final response."""
        if not self.open:
            return
        self._size += len(data)
        if self._size > self.limit:
            self._cut = True
            self._events.clear()
        elif final:
            self._final = json_splice.recorded(data)
            self._done = True
        else:
            # Line breaks only occur between JSON tokens: one data line per event.
            self._events.append(data.replace(b"\n", b" ").replace(b"\r", b" "))
        self._wake()

    def end(self) -> None:
        """The original's answer ended; a reader still waiting for its final response is cut."""
        if not self._done:
            self._cut = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def events(self, request_id: object) -> AsyncIterator[bytes]:
        """The answer as an event stream for the duplicate whose JSON-RPC id is
        ``request_id``: every event so far, then each as it comes, then the final response."""
        sent = 0
        while True:
            while sent < len(self._events):
                sent += 1
                yield render_event(self._events[sent - 1])
            if self._final is not None:
                line = json_splice.replay_line(
                    dumps(request_id), self._final, sep3182.REPLAYED_META_KEY
                )
                yield render_event(line)
                return
            if self._cut:
                # End abruptly, as a cut upstream stream ends: a clean end would say "whole".
                raise ConnectionError("the original's answer was cut or went over the limit")
            await self._changed.wait()


class LiveAnswers:
    """The streamed answers of the originals running in this gateway, by scope and key."""

    __slots__ = ("_answers", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._answers: dict[Where, LiveAnswer] = {}

    def start(self, where: Where, fingerprint: str) -> LiveAnswer:
        """An original's answer starts streaming: duplicates may attach to it until ``end``."""
        answer = LiveAnswer(fingerprint, self.limit)
        self._answers[where] = answer
        return answer

    def end(self, where: Where, answer: LiveAnswer) -> None:
        answer.end()
        if self._answers.get(where) is answer:
            del self._answers[where]

    def withdraw(self, where: Where) -> None:
        """The original was cancelled: no duplicate attaches any more, attached ones are cut."""
        answer = self._answers.pop(where, None)
        if answer is not None:
            answer.end()

    def attach(self, where: Where, fingerprint: str) -> LiveAnswer | None:
        """The original's live answer a duplicate with ``fingerprint`` may follow, if any
        (another fingerprint is a conflict: the key's policy answers it)."""
        answer = self._answers.get(where)
        if answer is None or not answer.open or answer.fingerprint != fingerprint:
            return None
        return answer
