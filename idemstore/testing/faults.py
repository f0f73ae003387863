"""A loopback TCP proxy that injects network faults between a store and its engine.

One proxy for every engine and every kind of test: it forwards bytes and knows nothing of the
protocol, so it sits in front of PostgreSQL, Redis, an HTTP endpoint (DynamoDB) or a
third-party engine alike. It runs its own event loop in a thread: a test's event loop, a
thread running a fault schedule, and worker processes talking through it need not share
anything with it, and every fault can be switched at any moment from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections import Counter
from typing import TYPE_CHECKING, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FaultProxy"]

_CHUNK = 65536
_LOOPBACK = "127.0.0.1"


class _Link:
    """One client connection and its upstream connection."""

    __slots__ = ("client", "doomed", "upstream")

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        # Set once a request was forwarded with a drop decided: its reply is never delivered.
        self.doomed = False

    def abort(self) -> None:
        # abort() closes with RST and discards unsent data: a cut, not a polite close.
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class FaultProxy:
    """``127.0.0.1:port`` forwarding to ``target_host:target_port``, with faults on demand.

    Point the store at ``proxy.port`` instead of the engine (``proxy.route(url)`` rewrites a
    store URL), then switch faults on and off while the store runs:

    - ``latency``: seconds added before every chunk is forwarded, in both directions.
    - ``drop_rate``: probability that a request chunk's connection is cut (RST): half the time
      before the chunk is forwarded (the engine never sees the request), half the time as the
      reply comes back (the engine did the work, the client never hears of it). Random draws
      come from ``seed``, so a failing run can be replayed.
    - ``drop_next_reply()``: forward the next request (or the next one containing some
      bytes), then cut its connection as the reply comes back: the work was done, the answer
      is lost.
    - ``drop_connections()``: reset every open connection at once.
    - ``hang()``: forward nothing in either direction and close nothing, new connections
      included (a peer that vanished, a partition, a half-open connection); ``resume()`` lets
      the held bytes flow again, as TCP does when a partition heals.

    ``counts`` tallies what happened (connections, requests and replies dropped, connections
    reset, half-open periods), for a test's report. Listens on loopback only.

    Example::

        async with FaultProxy.for_url(url) as proxy:
            async with open_store(proxy.route(url)) as store:
                proxy.drop_next_reply(containing=b"my-key")
                await store.reserve("my-key", "fp", lease_ttl=30, retention=3600)
                assert proxy.counts["replies dropped"] == 1

    ``with FaultProxy(...)`` works too, from code without an event loop.
    """

    host = _LOOPBACK

    def __init__(self, target_host: str, target_port: int, *, seed: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.latency = 0.0
        self.drop_rate = 0.0
        self.counts: Counter[str] = Counter()
        # Armed drops, oldest first: the bytes a request must contain (None: any request).
        self._doom: list[bytes | None] = []
        self._rng = random.Random(seed)
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy")

    @classmethod
    def for_url(cls, url: str, *, seed: int = 0) -> FaultProxy:
        """A proxy in front of the engine a store URL names: its host and port, or its
        ``endpoint_url`` query parameter when it has one (DynamoDB)."""
        endpoint = dict(parse_qsl(urlsplit(url).query)).get("endpoint_url")
        parts = urlsplit(endpoint or url)
        return cls(parts.hostname or _LOOPBACK, parts.port or 0, seed=seed)

    def route(self, url: str) -> str:
        """``url`` with the engine's address (or ``endpoint_url``) replaced by the proxy's."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        if "endpoint_url" in query:
            query["endpoint_url"] = f"http://{self.host}:{self.port}"
            return urlunsplit(parts._replace(query=urlencode(query)))
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@{self.host}:{self.port}" if user else f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- faults ---------------------------------------------------------------------------

    def hang(self) -> None:
        """Stop forwarding in both directions, keeping every socket open; new connections
        are accepted and starved too."""
        self._run(self._gate().clear)
        self.counts["half-open periods"] += 1

    def resume(self) -> None:
        """Forward again, the held bytes first."""
        self._run(self._gate().set)

    def drop_next_reply(self, *, containing: bytes | None = None) -> None:
        """Forward the next request (the next one whose chunk holds ``containing``, if
        given), then lose its reply: the connection is reset as the reply comes back."""
        self._run(lambda: self._doom.append(containing))

    def drop_connections(self) -> int:
        """Reset every open connection now; returns how many there were."""
        links = list(self._links)

        def cut() -> None:
            for link in links:
                link.abort()

        self._run(cut)
        self.counts["connections reset"] += len(links)
        return len(links)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        """Listen (on a free loopback port, then in ``port``); returns the proxy."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        """Reset every connection, stop listening and end the proxy's thread (once)."""
        if self._loop.is_closed():
            return

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

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        # In a thread: the caller's event loop keeps running while the proxy's starts.
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # -- the proxy's own loop -------------------------------------------------------------

    def _gate(self) -> asyncio.Event:
        if self._flowing is None:
            raise RuntimeError("start the FaultProxy first")
        return self._flowing

    def _run(self, call: Callable[[], object]) -> None:
        """Run ``call`` on the proxy's loop and wait for it: faults change between chunks."""

        if not self._thread.is_alive():
            raise RuntimeError("start the FaultProxy first")

        async def run() -> None:
            call()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((_LOOPBACK, 0))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._serve, sock=sock)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        try:
            await self._gate().wait()  # a partition starves new connections too
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

    def _dooms(self, data: bytes) -> bool:
        """Whether an armed drop takes this request chunk (and is used up by it)."""
        for index, marker in enumerate(self._doom):
            if marker is None or marker in data:
                del self._doom[index]
                return True
        return False

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        upstream: bool,
    ) -> None:
        gate = self._gate()
        try:
            while data := await reader.read(_CHUNK):
                if self.latency:
                    await asyncio.sleep(self.latency)
                await gate.wait()
                if not upstream and link.doomed:
                    self.counts["replies dropped"] += 1
                    return
                if upstream:
                    cut = bool(self.drop_rate and self._rng.random() < self.drop_rate)
                    if cut and self._rng.random() < 0.5:
                        self.counts["requests dropped"] += 1
                        return
                    # Decided before the request leaves: its reply may be the next to come.
                    link.doomed = link.doomed or cut or self._dooms(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side finished, broke or was cut: take the other down too, as a real cut would.
            link.abort()
