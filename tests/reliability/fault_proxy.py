"""A loopback TCP proxy that injects network faults between a store and its engine.

Point the store URL at ``proxy.port`` instead of the engine's. The proxy runs its own event
loop in a thread, so tests (and the worker processes behind it) need not share a loop with it.
Faults, switched at any moment from any thread:

- ``latency``: seconds added before every chunk is forwarded, in both directions.
- ``drop_rate``: probability that a request chunk's connection is cut (RST): half the time
  before the chunk is forwarded (the engine never sees the request), half the time as the
  reply comes back (the engine did the work, the client never hears of it).
- ``drop_next_reply()``: forward the next request, then cut its connection as the reply comes
  back (once, deterministically).
- ``drop_connections()``: reset every open connection at once.
- ``half_open(True)``: stop forwarding in both directions without closing anything, and
  starve new connections too (a peer that vanished, a partition). ``half_open(False)`` lets
  the held bytes flow again, as TCP does when a partition heals.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections import Counter
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["FaultProxy"]

_CHUNK = 65536


class _Link:
    """One client connection and its upstream connection."""

    __slots__ = ("client", "doomed", "upstream")

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        # Set once a request was forwarded with a drop decided: the reply is never delivered.
        self.doomed = False

    def abort(self) -> None:
        # abort() closes with RST and discards unsent data: a cut, not a polite close.
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class FaultProxy:
    """``127.0.0.1:port`` forwarding to ``target_host:target_port``, with faults on demand."""

    def __init__(self, target_host: str, target_port: int, *, seed: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.latency = 0.0
        self.drop_rate = 0.0
        self._doom_next = 0
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy")

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._serve, sock=sock)

    def _run(self, call: object) -> None:
        async def run() -> None:
            call()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def half_open(self, on: bool) -> None:
        """Stop (``True``) or resume (``False``) forwarding, keeping every socket open."""
        assert self._flowing is not None
        flowing = self._flowing
        self._run(flowing.clear if on else flowing.set)
        self.counts["half-open periods"] += on

    def drop_next_reply(self) -> None:
        """Forward the next request, then lose its reply (the connection is reset)."""

        def arm() -> None:
            self._doom_next += 1

        self._run(arm)

    def drop_connections(self) -> int:
        """Reset every open connection now; returns how many there were."""
        links = list(self._links)

        def cut() -> None:
            for link in links:
                link.abort()

        self._run(cut)
        self.counts["connections reset"] += len(links)
        return len(links)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        assert self._flowing is not None
        try:
            await self._flowing.wait()  # a partition starves new connections too
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, link, upstream=True),
                self._pump(up_reader, writer, link, upstream=False),
            )
        finally:
            self._links.discard(link)
            link.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        upstream: bool,
    ) -> None:
        assert self._flowing is not None
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if self.latency:
                    await asyncio.sleep(self.latency)
                await self._flowing.wait()
                if not upstream and link.doomed:
                    self.counts["replies dropped"] += 1
                    link.abort()
                    return
                cut = bool(upstream and self.drop_rate and self._rng.random() < self.drop_rate)
                if cut and self._rng.random() < 0.5:
                    self.counts["requests dropped"] += 1
                    link.abort()
                    return
                writer.write(data)
                await writer.drain()
                if upstream and self._doom_next:
                    self._doom_next -= 1
                    cut = True
                if cut:
                    link.doomed = True
        except (ConnectionError, OSError):
            pass
        finally:
            # One side finished or broke: take the other down too, as a real cut would.
            link.abort()

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.abort()
            if self._flowing is not None:
                self._flowing.set()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
