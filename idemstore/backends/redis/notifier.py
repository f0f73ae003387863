"""One pub/sub connection per Redis store, shared by every ``wait`` on it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

__all__ = [
    "Notifier",
    "ShardNotifiers",
    "Subscription",
    "shard_pubsub_everywhere",
    "shard_pubsub_in_all",
]


class Notifier:
    """One pub/sub connection per store, shared by every ``wait``.

    Waiters register an event per channel (the record's key); one reader task sets the events
    when a message arrives. When the connection fails, every waiter is woken and falls back to
    polling until a reconnect confirms a subscription again.
    """

    __slots__ = (
        "_closed",
        "_confirmations",
        "_connect",
        "_events",
        "_healthy",
        "_pubsub",
        "_pubsub_client",
        "_reader",
        "_send_lock",
        "_sharded",
        "_stale",
    )

    def __init__(
        self, connect: Callable[[], Awaitable[tuple[Any, Any]]], *, sharded: bool = False
    ) -> None:
        # connect() -> (client to close with the pub/sub, or None; PubSub)
        self._connect = connect
        # Sharded: shard channels (SSUBSCRIBE, Redis 7), on a connection to the node that owns
        # every channel this notifier is given.
        self._sharded = sharded
        self._pubsub: Any = None
        self._pubsub_client: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._events: dict[bytes, set[asyncio.Event]] = {}
        # Per channel, one future per SUBSCRIBE sent, resolved in order by the confirmations:
        # True when Redis confirmed, False when the connection failed first.
        self._confirmations: dict[bytes, list[asyncio.Future[bool]]] = {}
        self._stale: set[bytes] = set()
        # SUBSCRIBE and UNSUBSCRIBE go out in the order the waiters' bookkeeping changed, so
        # an UNSUBSCRIBE for a channel nobody waited on cannot overtake a new SUBSCRIBE.
        self._send_lock = asyncio.Lock()
        self._healthy = False
        self._closed = False

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def subscribe(self, channel: bytes, timeout: float) -> tuple[asyncio.Event, bool]:
        """An event set on every message on ``channel``, and whether the subscription is
        confirmed (then a PUBLISH after the caller's next read cannot be missed)."""
        event = asyncio.Event()
        self._events.setdefault(channel, set()).add(event)
        self._stale.discard(channel)
        if self._closed:
            return event, False
        confirmed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                async with self._send_lock:
                    if self._pubsub is None:
                        self._pubsub_client, self._pubsub = await self._connect()
                    elif _lost(self._pubsub):
                        # The reader reconnects (and then subscribes every channel waited on,
                        # this one too). Connecting here as well would put two coroutines on
                        # one socket: redis-py then fails inside either, untyped.
                        return event, False
                    self._confirmations.setdefault(channel, []).append(confirmed)
                    await self._subscribe(channel)
                if self._closed:
                    # close() ran while this connected: the connection would outlive it.
                    await self._close_connection()
                    self._drop(channel, confirmed)
                    return event, False
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.create_task(self._read(), name="idemstore-redis-wait")
                return event, await asyncio.shield(confirmed)
        except Exception:
            # Not only driver errors: when the connection breaks, redis-py's retries reconnect
            # it from whichever coroutine noticed, this send's or the reader's, and the other
            # then fails inside redis-py (RuntimeError: two readers on one socket;
            # AttributeError: the socket closed under a send). Either way this wait polls.
            self._drop(channel, confirmed)
            return event, False
        except asyncio.CancelledError:
            self._drop(channel, confirmed)
            self.release(channel, event)
            raise

    async def _subscribe(self, *channels: bytes) -> None:
        if self._sharded:
            await self._pubsub.ssubscribe(*channels)
        else:
            await self._pubsub.subscribe(*channels)

    async def _unsubscribe(self, *channels: bytes) -> None:
        if self._sharded:
            await self._pubsub.sunsubscribe(*channels)
        else:
            await self._pubsub.unsubscribe(*channels)

    def _drop(self, channel: bytes, confirmed: asyncio.Future[bool]) -> None:
        pending = self._confirmations.get(channel)
        if pending and confirmed in pending:
            pending.remove(confirmed)
        confirmed.cancel()

    def release(self, channel: bytes, event: asyncio.Event) -> None:
        """Forget ``event``; the reader unsubscribes channels nobody waits on any more."""
        waiting = self._events.get(channel)
        if waiting is None:
            return
        waiting.discard(event)
        if not waiting:
            del self._events[channel]
            self._stale.add(channel)

    async def _read(self) -> None:
        backoff = 0.05
        while not self._closed:
            try:
                if self._pubsub is None:
                    raise ConnectionError("no pub/sub connection")
                if self._stale:
                    async with self._send_lock:
                        stale, self._stale = self._stale - self._events.keys(), set()
                        if stale:
                            await self._unsubscribe(*stale)
                message = await self._pubsub.get_message(timeout=1.0)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception:
                # The connection is gone (after redis-py's own reconnect attempts). Wake every
                # waiter so it re-reads and polls, then reconnect and resubscribe.
                self._healthy = False
                self._fail_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                await self._reconnect()
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        kind = kind.decode() if isinstance(kind, bytes) else kind
        channel = message["channel"]
        if kind in ("message", "smessage"):
            for event in self._events.get(channel, ()):
                event.set()
        elif kind in ("subscribe", "ssubscribe"):
            self._healthy = True
            pending = self._confirmations.get(channel)
            if pending:
                first = pending.pop(0)
                if not first.done():
                    first.set_result(True)
                if not pending:
                    del self._confirmations[channel]
            else:
                # Nobody asked: redis-py reconnected and resubscribed by itself. A message
                # may have been lost in between, so the waiters must look again.
                for event in self._events.get(channel, ()):
                    event.set()

    def _fail_all(self) -> None:
        for pending in self._confirmations.values():
            for future in pending:
                if not future.done():
                    future.set_result(False)
        self._confirmations.clear()
        for waiting in self._events.values():
            for event in waiting:
                event.set()

    async def _reconnect(self) -> None:
        # Under the send lock: closing the connection while a subscriber sends on it would
        # pull the socket out from under that send.
        async with self._send_lock:
            await self._close_connection()
            try:
                self._pubsub_client, self._pubsub = await self._connect()
                if self._events:
                    await self._subscribe(*self._events)
            except Exception:
                # The reader tries again after a backoff; waiters keep polling meanwhile.
                await self._close_connection()

    async def _close_connection(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        client, self._pubsub_client = self._pubsub_client, None
        # Closing a broken connection may fail too; there is nothing left to do about it.
        with contextlib.suppress(Exception):
            if pubsub is not None:
                await pubsub.aclose()
        with contextlib.suppress(Exception):
            if client is not None:
                await client.aclose()

    async def close(self) -> None:
        self._closed = True
        self._healthy = False
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        self._fail_all()
        await self._close_connection()


def _lost(pubsub: Any) -> bool:
    """Whether ``pubsub`` had a connection that is now closed (a new one has none yet)."""
    connection = pubsub.connection
    return connection is not None and not connection.is_connected


class Subscription:
    """One ``wait``'s interest in one channel: pushing once Redis confirmed the subscription
    and while the pub/sub connection stays healthy."""

    __slots__ = ("_channel", "_confirmed", "_notifier", "event")

    def __init__(
        self, notifier: Notifier, channel: bytes, event: asyncio.Event, confirmed: bool
    ) -> None:
        self._notifier = notifier
        self._channel = channel
        self._confirmed = confirmed
        self.event = event

    @property
    def pushing(self) -> bool:
        return self._confirmed and self._notifier.healthy

    def close(self) -> None:
        self._notifier.release(self._channel, self.event)


class ShardNotifiers:
    """Sharded pub/sub on a cluster: one ``Notifier`` per node, connected to that node.

    A shard channel can only be subscribed to on the node that owns its slot, so a wait
    subscribes through the notifier of its key's node. Should the slot move, Redis ends the
    subscription and the wait falls back to its periodic re-read until it subscribes again.
    """

    __slots__ = ("_by_node", "_options")

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._by_node: dict[str, Notifier] = {}

    async def connect(self, node: Any) -> tuple[Any, Any]:
        """A client of its own to cluster node ``node`` and a pub/sub on it (``Notifier``'s
        ``connect``)."""
        from redis.asyncio import Redis

        own = Redis(host=node.host, port=node.port, **self._options)
        return own, own.pubsub()

    def for_node(self, node: Any) -> Notifier:
        """The sharded notifier of cluster node ``node`` (a redis-py ``ClusterNode``)."""
        notifier = self._by_node.get(node.name)
        if notifier is None:
            connect = functools.partial(self.connect, node)
            notifier = self._by_node[node.name] = Notifier(connect, sharded=True)
        return notifier

    async def close(self) -> None:
        notifiers, self._by_node = list(self._by_node.values()), {}
        for notifier in notifiers:
            await notifier.close()


# The first Redis version with sharded pub/sub (SPUBLISH, SSUBSCRIBE).
SHARDED_PUBSUB_SINCE = (7, 0)


async def shard_pubsub_everywhere(client: Any) -> bool:
    """Whether every node of the cluster ``client`` reaches runs a Redis with sharded
    pub/sub; until all do, the store keeps PUBLISH, which every version delivers."""
    answers = await client.info("server", target_nodes="all")
    sections = [answers] if "redis_version" in answers else list(answers.values())
    return shard_pubsub_in_all(str(section.get("redis_version", "0")) for section in sections)


def shard_pubsub_in_all(versions: Iterable[str]) -> bool:
    """Whether every Redis version in ``versions`` (``INFO``'s ``redis_version``) has sharded
    pub/sub; an unreadable version counts as too old."""
    for version in versions:
        parts = tuple(int(p) if p.isdigit() else -1 for p in version.split(".")[:2])
        if parts < SHARDED_PUBSUB_SINCE:
            return False
    return True
