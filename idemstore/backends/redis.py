"""``redis://``, ``rediss://`` and ``redis+cluster://h1:p1,h2:p2``: records in Redis hashes.

Every operation is one Lua script run with EVALSHA (EVAL when the node answers NOSCRIPT) on
exactly one key, so it is one round trip, atomic, and works unchanged on Redis Cluster. Lease
and retention deadlines are hash fields compared with the server's ``TIME``; the key's own
expiry removes a record by itself shortly after its retention ends (``expiry_grace``).
``wait`` is woken by a PUBLISH that ``complete``, ``release`` and ``delete`` send from inside
their script, on one pub/sub connection per store, and falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import random
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import unquote, urlsplit, urlunsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from idemstore.errors import ConfigurationError, StoreUnavailableError
from idemstore.protocol import Lease, Outcome, Record, Reservation, Status
from idemstore.records import (
    MAX_KEY_LENGTH,
    check_duration,
    check_identity,
    check_limit,
    check_response,
    check_timeout,
    new_token,
)
from idemstore.stats import DEFAULT_LIMIT, StatsTally, StoreStats
from idemstore.urls import (
    malformed_url_error,
    parse_store_url,
    pop_bool,
    pop_float,
    pop_int,
    pop_str,
    redact_url,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

__all__ = ["RedisStore"]

DEFAULT_PORT = 6379
DEFAULT_PREFIX = "idem:"

# -- Lua ------------------------------------------------------------------------------------
#
# A record is one hash. Fields: st (p = in progress, c = completed, r = released tombstone),
# fp, tok, fen, ca / ea / la (created, retention deadline, lease deadline: microseconds of the
# server clock), tk (1 when the lease was a takeover), res (the response, raw bytes), op (the
# nonce of the complete or release that finished the lease).
# The key expires by itself at ea + grace; until then the scripts treat it as gone once ea has
# passed, so no read ever returns an expired record, yet the fence still continues.

# Lua numbers passed to redis.call are written with 17 significant digits, so microsecond
# timestamps (16 digits) are stored exactly without string.format (which costs more than the
# HSET itself). That holds only below 2^53 us (the year 2255): past it a double skips
# integers, and from 1e17 on it is written in scientific notation, which PEXPIREAT refuses
# (after the HSET already ran: a script is not rolled back). So every script computes its
# deadlines first and refuses one out of range before it writes anything.
_MAX_DEADLINE_US = 2**53
_RANGE_ERROR = "IDEMSTORE_RANGE"
_MAX_GRACE = 100 * 365 * 86400.0
# A read inside wait gets at least this long even when less of the timeout is left, so that
# wait(timeout=0) still reads once and a read right at the deadline is not cut off (cutting
# one costs the connection: redis-py drops it rather than leave a reply unread on it).
_WAIT_READ_FLOOR = 0.05
_PRELUDE = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
"""


def _in_range(name: str, deadline: str) -> str:
    """Lua that refuses (with an error naming ``name``) a ``deadline`` past 2^53 us."""
    return f"""
if {deadline} >= {_MAX_DEADLINE_US} then
  return redis.error_reply('{_RANGE_ERROR} {name}')
end
"""


# ARGV: fingerprint, token, lease_us, retention_us, grace_ms.
# Reply: {'a', now, fence, takeover, lease_deadline} or {outcome, now, <record fields>}.
_RESERVE = (
    _PRELUDE
    + """
local ea = now + ARGV[4]
local la = now + ARGV[3]
"""
    + _in_range("retention", "ea")
    + _in_range("lease_ttl", "la")
    + """
local h = redis.call('HMGET', KEYS[1], 'st', 'fp', 'tok', 'fen', 'ca', 'ea', 'la', 'res', 'tk')
local st = h[1]
local fence = tonumber(h[4]) or 0
local takeover = 0
-- Live means neither a released tombstone nor past retention (the key may outlive ea).
if st and st ~= 'r' and tonumber(h[6]) > now then
  if h[3] == ARGV[2] then
    -- Our own token: this is redis-py retrying a reserve whose reply was lost. Answer as the
    -- first attempt did instead of making the caller wait on its own lease.
    return {'a', now, fence, tonumber(h[9]) or 0, tonumber(h[7])}
  end
  local found = {'?', now, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]}
  -- A different fingerprint never takes a key over, whatever its state.
  if h[2] ~= ARGV[1] then found[1] = 'm' return found end
  if st == 'c' then found[1] = 'c' return found end
  -- A live lease holds the key; only one past its deadline may be taken over.
  if tonumber(h[7]) > now then found[1] = 'p' return found end
  takeover = 1
end
-- The fence continues from whatever trace is left (tombstone, expired record), so it rises
-- strictly with every acquisition for as long as the key exists.
fence = fence + 1
if h[8] then redis.call('HDEL', KEYS[1], 'res') end
redis.call('HSET', KEYS[1], 'st', 'p', 'fp', ARGV[1], 'tok', ARGV[2], 'fen', fence,
  'ca', now, 'ea', ea, 'la', la, 'tk', takeover)
redis.call('PEXPIREAT', KEYS[1], math.ceil(ea / 1000) + ARGV[5])
return {'a', now, fence, takeover, la}
"""
)

# Only the holder may finish: same token AND fence (a token alone could be replayed by a stale
# owner after a takeover reused nothing but the key), still in progress (not completed or
# released), and not past retention. The lease deadline is deliberately not checked: a lapsed
# lease that nobody took over may still complete.
_HOLDER_CHECK = """
local h = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fen', 'ea', 'la')
if h[1] ~= 'p' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[4]) <= now then
  return false
end
"""

# complete and release also store ARGV[3], a nonce of the call, in 'op'. redis-py resends a
# script whose reply was lost with the connection; that second run fails the holder check
# because the first one already finished the lease. Finding our own nonce (with our token and
# fence: only a new reservation changes those) means it was us, so answer as the first run did.
_FINISH_CHECK = """
local h = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fen', 'ea', 'la', 'op')
if h[1] ~= 'p' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[4]) <= now then
  if h[6] == ARGV[3] and h[2] == ARGV[1] and h[3] == ARGV[2] then return 1 end
  return false
end
"""

# ARGV: token, fence, nonce, response, retention_us, grace_ms. Reply: 1 or nil.
_COMPLETE = (
    _PRELUDE
    + """
local ea = now + ARGV[5]
"""
    + _in_range("retention", "ea")
    + _FINISH_CHECK
    + """
redis.call('HSET', KEYS[1], 'st', 'c', 'res', ARGV[4], 'ea', ea, 'op', ARGV[3])
redis.call('HDEL', KEYS[1], 'la')
redis.call('PEXPIREAT', KEYS[1], math.ceil(ea / 1000) + ARGV[6])
redis.call('PUBLISH', KEYS[1], 'c')
return 1
"""
)

# ARGV: token, fence, nonce. Reply: 1 or nil. The hash stays as a tombstone (with its fence)
# until the key expires, so the next acquisition gets a higher fence than any lease handed out.
_RELEASE = (
    _PRELUDE
    + _FINISH_CHECK
    + """
redis.call('HSET', KEYS[1], 'st', 'r', 'op', ARGV[3])
redis.call('HDEL', KEYS[1], 'la')
redis.call('PUBLISH', KEYS[1], 'r')
return 1
"""
)

# ARGV: token, fence, lease_us. Reply: the new lease deadline or nil. A lease already past
# its deadline is lost even if nobody took it over yet: others are entitled to the key.
_EXTEND = (
    _PRELUDE
    + """
local la = now + ARGV[3]
"""
    + _in_range("lease_ttl", "la")
    + _HOLDER_CHECK
    + """
if tonumber(h[5]) <= now then return false end
redis.call('HSET', KEYS[1], 'la', la)
return la
"""
)

# Reply: {now, <record fields>} or nil when there is no live record.
_GET = (
    _PRELUDE
    + """
local h = redis.call('HMGET', KEYS[1], 'st', 'fp', 'tok', 'fen', 'ca', 'ea', 'la', 'res')
if not h[1] or h[1] == 'r' or tonumber(h[6]) <= now then return false end
return {now, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]}
"""
)

# Reply: 1 when a live record was deleted. Waiters are woken whatever was there.
_DELETE = (
    _PRELUDE
    + """
local h = redis.call('HMGET', KEYS[1], 'st', 'ea')
if not h[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'd')
if h[1] ~= 'r' and tonumber(h[2]) > now then return 1 end
return 0
"""
)

# Reply: 1 when the key was past retention and is now gone. Checked again here because the
# record may have been re-reserved since the sweep looked at it.
_SWEEP_ONE = (
    _PRELUDE
    + """
local ea = redis.call('HGET', KEYS[1], 'ea')
if ea and tonumber(ea) <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
)


class _Script:
    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_SCRIPTS = {
    name: _Script(source)
    for name, source in {
        "reserve": _RESERVE,
        "complete": _COMPLETE,
        "release": _RELEASE,
        "extend": _EXTEND,
        "get": _GET,
        "delete": _DELETE,
        "sweep": _SWEEP_ONE,
    }.items()
}

# -- keys -----------------------------------------------------------------------------------

# Braces would end the hash tag early and '%' is the escape itself. The scope also escapes
# ':' so that the first ':' inside the tag separates scope from key: ("a:b", "c") and
# ("a", "b:c") become "{a%3Ab:c}" and "{a:b:c}".
_KEY_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_SCOPE_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D", ":": "%3A"})
_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def record_key(prefix: str, scope: str, key: str) -> bytes:
    """The Redis key of ``(scope, key)``: ``PREFIX{scope:key}``, escaped, all in the hash tag.

    The whole identity is the hash tag, so a record and anything tied to it share a slot.
    """
    return f"{prefix}{{{scope.translate(_SCOPE_ESCAPES)}:{key.translate(_KEY_ESCAPES)}}}".encode()


# Durations are capped at 100 years: deadlines in microseconds must stay integers a Lua double
# holds exactly (below 2**53, about the year 2255), and PEXPIREAT refuses larger ones, so a
# lease_ttl or retention of, say, 1e300 would otherwise fail every reserve.
MAX_DURATION = 100 * 365.25 * 86400


@functools.lru_cache(maxsize=256)  # callers reuse a handful of lease/retention durations
def _micros(seconds: float) -> str:
    return str(max(1, round(min(seconds, MAX_DURATION) * 1_000_000)))


def _seconds(micros: bytes | int) -> float:
    # float(), not int(): a deadline stored in scientific notation (by a version that let
    # deadlines pass 1e17 us) must still read back instead of raising ValueError.
    return float(micros) / 1_000_000


def _integer(raw: bytes | int) -> int:
    try:
        return int(raw)
    except ValueError:
        return int(float(raw))


def _record(scope: str, key: str, fields: list[Any]) -> Record:
    st, fp, tok, fen, ca, ea, la, res = fields
    status = Status.COMPLETED if st == b"c" else Status.IN_PROGRESS
    return Record(
        scope=scope,
        key=key,
        fingerprint=fp.decode(),
        status=status,
        token=tok.decode(),
        fence=_integer(fen),
        response=bytes(res) if status is Status.COMPLETED and res is not None else None,
        created_at=_seconds(ca),
        expires_at=_seconds(ea),
        lease_expires_at=_seconds(la) if status is Status.IN_PROGRESS and la else None,
    )


_DRIVER_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)

# -- pub/sub --------------------------------------------------------------------------------


class _Notifier:
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
        "_stale",
    )

    def __init__(self, connect: Callable[[], Awaitable[tuple[Any, Any]]]) -> None:
        # connect() -> (client to close with the pub/sub, or None; PubSub)
        self._connect = connect
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
                    self._confirmations.setdefault(channel, []).append(confirmed)
                    await self._pubsub.subscribe(channel)
                if self._closed:
                    # close() ran while this connected: the connection would outlive it.
                    await self._close_connection()
                    self._drop(channel, confirmed)
                    return event, False
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.create_task(self._read(), name="idemstore-redis-wait")
                return event, await asyncio.shield(confirmed)
        except _DRIVER_ERRORS:
            self._drop(channel, confirmed)
            return event, False
        except asyncio.CancelledError:
            self._drop(channel, confirmed)
            self.release(channel, event)
            raise

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
                            await self._pubsub.unsubscribe(*stale)
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
        if kind == "message":
            for event in self._events.get(channel, ()):
                event.set()
        elif kind == "subscribe":
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
        await self._close_connection()
        try:
            async with self._send_lock:
                self._pubsub_client, self._pubsub = await self._connect()
                if self._events:
                    await self._pubsub.subscribe(*self._events)
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


# -- the store ------------------------------------------------------------------------------


class RedisStore:
    """A store in Redis or Redis Cluster. Build it with ``open_store(url)`` or ``from_url``.

    Options (URL query parameters or keyword arguments): ``prefix`` (``idem:``), ``db``,
    ``socket_timeout`` (5 s), ``socket_connect_timeout`` (5 s), ``retries`` (2),
    ``operation_timeout`` (none: a hard cap on one call, retries included; without it a call
    gives up after ``retries + 1`` attempts, each bounded by the socket timeouts),
    ``max_connections`` (100 in-flight operations; more wait at most ``socket_timeout`` for a
    free one), ``expiry_grace`` (60 s the key outlives its retention, invisible to reads),
    ``max_key_length``, and for ``rediss://`` ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``.
    """

    __slots__ = (
        "_client",
        "_client_options",
        "_closed",
        "_cluster",
        "_connect_lock",
        "_grace_ms",
        "_limit",
        "_max_connections",
        "_max_key_length",
        "_nodes",
        "_notifier",
        "_operation_timeout",
        "_prefix",
        "_queue_timeout",
        "_where",
    )

    def __init__(
        self,
        nodes: list[tuple[str, int]],
        *,
        cluster: bool = False,
        tls: bool = False,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 5.0,
        operation_timeout: float | None = None,
        retries: int = 2,
        max_connections: int = 100,
        expiry_grace: float = 60.0,
        max_key_length: int = MAX_KEY_LENGTH,
        ssl_options: dict[str, Any] | None = None,
        where: str | None = None,
    ) -> None:
        if not nodes:
            raise ConfigurationError("a redis store needs at least one host")
        if "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"prefix {prefix!r} must not contain '{{' or '}}': the record's hash tag "
                "must be the first braces in the key"
            )
        if cluster and db:
            raise ConfigurationError("Redis Cluster has only database 0")
        for name, value in (
            ("socket_timeout", socket_timeout),
            ("socket_connect_timeout", socket_connect_timeout),
        ):
            check_duration(name, value)
        if operation_timeout is not None:
            check_duration("operation_timeout", operation_timeout)
        if retries < 0:
            raise ConfigurationError(f"retries must be 0 or more, not {retries}")
        if max_connections < 1:
            raise ConfigurationError(f"max_connections must be at least 1, not {max_connections}")
        # Bounded so that PEXPIREAT's argument (retention deadline + grace, in ms) stays an
        # integer a Lua number writes exactly.
        if not math.isfinite(expiry_grace) or not 0 <= expiry_grace <= _MAX_GRACE:
            raise ConfigurationError(
                f"expiry_grace must be 0 to {_MAX_GRACE:.0f} seconds, not {expiry_grace!r}"
            )
        self._nodes = list(nodes)
        self._cluster = cluster
        self._prefix = prefix
        self._operation_timeout = operation_timeout
        self._queue_timeout = operation_timeout or socket_timeout
        self._grace_ms = str(math.ceil(min(expiry_grace, MAX_DURATION) * 1000))
        self._max_key_length = max_key_length
        self._where = where or ",".join(f"{h}:{p}" for h, p in nodes)
        options: dict[str, Any] = {
            "username": username,
            "password": password,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
            # Responses are raw bytes: never let the driver decode them.
            "decode_responses": False,
            "retry": Retry(ExponentialBackoff(cap=0.5, base=0.02), retries),
        }
        if tls:
            options["ssl"] = True
            options.update(ssl_options or {})
        if not cluster:
            options["db"] = db
        self._client_options = options
        # The driver's pools fail (rather than wait) when exhausted, so limit in-flight
        # operations here; the pool gets one more connection for the pub/sub reader.
        self._max_connections = max_connections
        self._limit = asyncio.Semaphore(max_connections)
        self._client: Any = None
        self._connect_lock = asyncio.Lock()
        self._notifier = _Notifier(self._open_pubsub)
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        cluster = scheme == "redis+cluster"
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise malformed_url_error(url, exc) from None
        userinfo, _, hosts = parts.netloc.rpartition("@")
        nodes = [_host_port(item, url) for item in hosts.split(",") if item]
        if not nodes:
            nodes = [("127.0.0.1", DEFAULT_PORT)]
        if len(nodes) > 1 and not cluster:
            raise ConfigurationError(
                "several hosts need a redis+cluster:// URL; redis:// names one server"
            )
        # parse_store_url splits one host:port; give it the first so it handles the rest.
        first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
        parsed = parse_store_url(urlunsplit(parts._replace(netloc=first)), options)
        db = 0
        path = parsed.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigurationError(
                    f"the path of a redis URL is a database number: {redact_url(url)!r}"
                )
            db = int(path)
        db = pop_int(parsed.options, "db", db)
        ssl_options: dict[str, Any] = {}
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
            if name in parsed.options:
                ssl_options[name] = pop_str(parsed.options, name, "")
        if "ssl_check_hostname" in parsed.options:
            ssl_options["ssl_check_hostname"] = pop_bool(parsed.options, "ssl_check_hostname", True)
        tls = pop_bool(parsed.options, "ssl", scheme == "rediss")
        if ssl_options and not tls:
            raise ConfigurationError("ssl_* options need a rediss:// URL (or ssl=true)")
        store = cls(
            nodes,
            cluster=cluster,
            tls=tls,
            db=db,
            username=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password is not None else None,
            prefix=pop_str(parsed.options, "prefix", DEFAULT_PREFIX),
            socket_timeout=pop_float(parsed.options, "socket_timeout", 5.0),
            socket_connect_timeout=pop_float(parsed.options, "socket_connect_timeout", 5.0),
            operation_timeout=(
                pop_float(parsed.options, "operation_timeout", 0.0)
                if "operation_timeout" in parsed.options
                else None
            ),
            retries=pop_int(parsed.options, "retries", 2),
            max_connections=pop_int(parsed.options, "max_connections", 100),
            expiry_grace=pop_float(parsed.options, "expiry_grace", 60.0),
            max_key_length=pop_int(parsed.options, "max_key_length", MAX_KEY_LENGTH),
            ssl_options=ssl_options,
            where=redact_url(url),
        )
        parsed.reject_unknown()
        return store

    # -- connections ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RedisStore is closed")

    def _new_client(self) -> Any:
        if self._cluster:
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in self._nodes],
                max_connections=self._max_connections + 1,
                **self._client_options,
            )
        host, port = self._nodes[0]
        return Redis(
            host=host,
            port=port,
            max_connections=self._max_connections + 1,
            **self._client_options,
        )

    async def _ready(self) -> Any:
        self._check_open()
        if self._client is not None:
            return self._client
        async with self._connect_lock:
            # close() may have run while this waited for the lock or for the cluster's
            # first answer: a client built now would outlive the store, so drop it.
            self._check_open()
            if self._client is None:
                client = self._new_client()
                if self._cluster:
                    try:
                        await client.initialize()
                    except BaseException:
                        await client.aclose()
                        raise
                if self._closed:
                    with contextlib.suppress(*_DRIVER_ERRORS):
                        await client.aclose()
                    self._check_open()
                self._client = client
        return self._client

    async def _open_pubsub(self) -> tuple[Any, Any]:
        """A pub/sub connection: on a cluster, to any node (PUBLISH reaches every node)."""
        client = await self._ready()
        if not self._cluster:
            return None, client.pubsub()
        node = random.choice(client.get_nodes())
        options = {k: v for k, v in self._client_options.items() if k != "db"}
        own = Redis(host=node.host, port=node.port, **options)
        return own, own.pubsub()

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        timed_out = isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__
        what = "did not answer in time" if timed_out else "is unavailable"
        return StoreUnavailableError(
            f"redis store {self._where} {what}: {type(exc).__name__}: {exc}".rstrip(": ")
        )

    async def _run(self, name: str, key: bytes, *args: str | bytes) -> Any:
        """Run one script on ``key``; with ``operation_timeout``, within that time."""
        if self._operation_timeout is None:
            # The hot path: no timer of our own; the socket timeouts bound every wait.
            return await self._call(_SCRIPTS[name], key, args)
        try:
            async with asyncio.timeout(self._operation_timeout):
                return await self._call(_SCRIPTS[name], key, args)
        except TimeoutError as exc:
            raise self._unavailable(exc) from exc

    async def _call(self, script: _Script, key: bytes, args: tuple[str | bytes, ...]) -> Any:
        """EVALSHA, or EVAL when the node does not know the script (yet, or any more)."""
        try:
            client = self._client if self._client is not None else await self._ready()
            if self._limit.locked():
                await self._wait_for_slot()
            else:
                await self._limit.acquire()  # free: returns at once
            try:
                return await client.execute_command("EVALSHA", script.sha, 1, key, *args)
            except NoScriptError:
                # This node restarted or was flushed: EVAL runs and caches it again.
                return await client.execute_command("EVAL", script.source, 1, key, *args)
            finally:
                self._limit.release()
        except ResponseError as exc:
            if str(exc).startswith(_RANGE_ERROR):
                name = str(exc).split()[1]
                raise ConfigurationError(
                    f"{name} is too long for Redis: the deadline would fall past the year 2255 "
                    "(2**53 microseconds after the epoch, the last a Lua number holds exactly)"
                ) from None
            raise self._unavailable(exc) from exc
        except _DRIVER_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def _acquire_slot(self) -> None:
        if not self._limit.locked():
            await self._limit.acquire()  # free: returns at once, no timer
            return
        await self._wait_for_slot()

    async def _wait_for_slot(self) -> None:
        try:
            await asyncio.wait_for(self._limit.acquire(), self._queue_timeout)
        except TimeoutError:
            raise StoreUnavailableError(
                f"redis store {self._where}: all {self._max_connections} connections stayed "
                f"busy for {self._queue_timeout}s (raise max_connections?)"
            ) from None

    def _key(self, scope: str, key: str) -> bytes:
        return record_key(self._prefix, scope, key)

    # -- the contract ---------------------------------------------------------------------

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        check_identity(key, scope, fingerprint, max_key_length=self._max_key_length)
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        retention = check_duration("retention", retention)
        self._check_open()
        token = new_token()
        reply = await self._run(
            "reserve",
            self._key(scope, key),
            fingerprint,
            token,
            _micros(lease_ttl),
            _micros(retention),
            self._grace_ms,
        )
        outcome = reply[0]
        if outcome == b"a":
            _, _, fence, takeover, deadline = reply
            lease = Lease(scope, key, token, _integer(fence), _seconds(deadline), retention)
            return Reservation(Outcome.ACQUIRED, lease=lease, takeover=bool(takeover))
        record = _record(scope, key, reply[2:])
        kind = {b"m": Outcome.MISMATCH, b"c": Outcome.COMPLETED, b"p": Outcome.IN_PROGRESS}
        return Reservation(kind[outcome], record=record)

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        response = check_response(response)
        keep = check_duration("retention", retention if retention is not None else lease.retention)
        self._check_open()
        reply = await self._run(
            "complete",
            self._key(lease.scope, lease.key),
            lease.token,
            str(lease.fence),
            new_token(),
            response,
            _micros(keep),
            self._grace_ms,
        )
        return reply is not None

    async def release(self, lease: Lease) -> bool:
        self._check_open()
        reply = await self._run(
            "release", self._key(lease.scope, lease.key), lease.token, str(lease.fence), new_token()
        )
        return reply is not None

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        self._check_open()
        reply = await self._run(
            "extend",
            self._key(lease.scope, lease.key),
            lease.token,
            str(lease.fence),
            _micros(lease_ttl),
        )
        if reply is None:
            return None
        return Lease(
            lease.scope, lease.key, lease.token, lease.fence, _seconds(reply), lease.retention
        )

    async def _read(self, scope: str, key: str, name: bytes) -> tuple[Record | None, float]:
        reply = await self._run("get", name)
        if reply is None:
            return None, 0.0
        return _record(scope, key, reply[1:]), _seconds(reply[0])

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        check_identity(key, scope, max_key_length=self._max_key_length)
        self._check_open()
        record, _ = await self._read(scope, key, self._key(scope, key))
        return record

    async def _read_by(
        self, scope: str, key: str, name: bytes, deadline: float
    ) -> tuple[Record | None, float]:
        """``_read`` given until ``deadline`` (at least ``_WAIT_READ_FLOOR``): ``TimeoutError``
        when it did not finish by then."""
        floor = asyncio.get_running_loop().time() + _WAIT_READ_FLOOR
        async with asyncio.timeout_at(max(deadline, floor)):
            return await self._read(scope, key, name)

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        """Every read is bounded by the time left (the socket timeouts and redis-py's
        retries could otherwise hold one far past ``timeout``). When the first read cannot
        finish in time, nothing is known: ``StoreUnavailableError``. When a later one cannot,
        the record it was meant to refresh is returned, the last one the store answered."""
        check_identity(key, scope, max_key_length=self._max_key_length)
        timeout = check_timeout(timeout)
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        name = self._key(scope, key)
        try:
            record, now = await self._read_by(scope, key, name, deadline)
        except TimeoutError as exc:
            raise self._unavailable(exc) from exc
        if _settled(record, now) or loop.time() >= deadline:
            return record
        # Subscribe first, then read again: a PUBLISH after that read cannot be missed.
        event, confirmed = await self._notifier.subscribe(
            name, min(self._queue_timeout, max(0.05, deadline - loop.time()))
        )
        poll = 0.01
        try:
            while True:
                event.clear()
                try:
                    record, now = await self._read_by(scope, key, name, deadline)
                except TimeoutError:
                    return record
                remaining = deadline - loop.time()
                if _settled(record, now) or remaining <= 0:
                    return record
                assert record is not None and record.lease_expires_at is not None
                # Without a confirmed subscription, poll with capped backoff; with one, still
                # look again now and then in case a message was lost in a reconnect.
                pushed = confirmed and self._notifier.healthy
                cap = 1.0 if pushed else poll
                poll = min(poll * 2, 0.25)
                # Also wake when the lease lapses: nobody publishes that.
                lapse = record.lease_expires_at - now + 0.001
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, lapse, cap))
        finally:
            self._notifier.release(name, event)

    async def delete(self, key: str, *, scope: str = "") -> bool:
        check_identity(key, scope, max_key_length=self._max_key_length)
        self._check_open()
        return bool(await self._run("delete", self._key(scope, key)))

    async def sweep(self, *, limit: int = 1000) -> int:
        """Remove up to ``limit`` records past retention that Redis has not expired yet.

        Redis deletes every record by itself ``expiry_grace`` after its retention ends, so
        running a sweeper is optional. This walks the prefix with SCAN (every primary on a
        cluster), which costs a pass over the keyspace.
        """
        limit = check_limit(limit)
        self._check_open()
        pattern = self._prefix.translate(_GLOB_SPECIAL).encode() + b"{*"
        grace_ms = int(self._grace_ms)
        removed = 0
        try:
            client = await self._ready()
            batch: list[bytes] = []
            async for name in client.scan_iter(match=pattern, count=1000):
                batch.append(name)
                if len(batch) >= 1000:
                    removed += await self._sweep_batch(client, batch, grace_ms, limit - removed)
                    batch = []
                    if removed >= limit:
                        return removed
            if batch:
                removed += await self._sweep_batch(client, batch, grace_ms, limit - removed)
        except _DRIVER_ERRORS as exc:
            raise self._unavailable(exc) from exc
        return removed

    async def _sweep_batch(self, client: Any, names: list[bytes], grace_ms: int, room: int) -> int:
        # A key past retention has at most the grace period (plus rounding) left to live;
        # only those are worth a script call, which checks the retention deadline itself.
        await self._acquire_slot()
        try:
            pipe = client.pipeline(transaction=False) if not self._cluster else client.pipeline()
            for name in names:
                pipe.pttl(name)
            ttls = await pipe.execute()
        finally:
            self._limit.release()
        removed = 0
        for name, ttl in zip(names, ttls, strict=True):
            if removed >= room:
                break
            if isinstance(ttl, int) and 0 <= ttl <= grace_ms + 1:
                removed += int(await self._run("sweep", name))
        return removed

    async def stats(self, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
        """Read at most ``limit`` records: SCAN of the prefix (every primary on a cluster) and
        one HMGET of four fields per record, pipelined by 1000. Redis keeps no count by state,
        so this is a pass over the keyspace, bounded by ``limit``."""
        check_limit(limit)
        self._check_open()
        pattern = self._prefix.translate(_GLOB_SPECIAL).encode() + b"{*"
        statuses = {b"p": "in_progress", b"c": "completed", b"r": "released"}
        try:
            client = await self._ready()
            seconds, micros = await client.time()
            tally = StatsTally(seconds + micros / 1e6)
            names: list[bytes] = []
            complete = True
            async for name in client.scan_iter(match=pattern, count=1000):
                if tally.scanned + len(names) >= limit:
                    complete = False
                    break
                names.append(name)
                if len(names) >= 1000:
                    await self._tally_batch(client, names, statuses, tally)
                    names = []
            if names:
                await self._tally_batch(client, names, statuses, tally)
        except _DRIVER_ERRORS as exc:
            raise self._unavailable(exc) from exc
        method = "SCAN of the key prefix and HMGET of each record (a pass over the keyspace)"
        return tally.result(complete=complete, method=method)

    async def _tally_batch(
        self, client: Any, names: list[bytes], statuses: dict[bytes, str], tally: StatsTally
    ) -> None:
        await self._acquire_slot()
        try:
            pipe = client.pipeline(transaction=False) if not self._cluster else client.pipeline()
            for name in names:
                pipe.hmget(name, "st", "ca", "ea", "la")
            rows = await pipe.execute()
        finally:
            self._limit.release()
        for status, created, expires, lease in rows:
            if status is None or expires is None:
                continue  # expired (or deleted) between SCAN and HMGET
            tally.add(
                statuses.get(status, "released"),
                float(created or 0) / 1e6,
                float(expires) / 1e6,
                None if lease is None else float(lease) / 1e6,
            )

    async def ping(self) -> None:
        try:
            async with asyncio.timeout(self._operation_timeout or self._queue_timeout * 2):
                client = await self._ready()
                await client.ping()
        except _DRIVER_ERRORS as exc:
            raise self._unavailable(exc) from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._notifier.close()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await client.aclose()

    async def __aenter__(self) -> Self:
        await self.ping()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _settled(record: Record | None, now: float) -> bool:
    """No live lease holds the key: absent, completed, or its lease lapsed."""
    if record is None or record.status is Status.COMPLETED:
        return True
    return record.lease_expires_at is None or record.lease_expires_at <= now


def _host_port(item: str, url: str) -> tuple[str, int]:
    host, port = item, ""
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host:
        raise ConfigurationError(f"store URL {redact_url(url)!r} has an empty host")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        # Not echoed: a password with an unencoded '/' ends the host part early and lands here.
        raise ConfigurationError(f"store URL {redact_url(url)!r} has a bad port")
    return host, int(port)
