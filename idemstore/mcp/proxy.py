"""A stdio relay that deduplicates ``tools/call`` in front of any unmodified MCP server.

Every message passes byte-for-byte in both directions, except ``tools/call`` requests that carry
or get an idempotency key (and their responses), and the ``initialize`` / ``server/discover``
results, where ``capabilities.tools.idempotency = {}`` is added. Lines are parsed with
``json.loads`` only to decide; anything relayed is the original bytes.

Three kinds of key, in this order:

- ``params.idempotencyKey`` (SEP-3182): a duplicate in flight is rejected at once, other
  arguments are a conflict, and the outcome (result *or* error) is replayed. The field is
  stripped before forwarding, since the server does not know it.
- ``params._meta["idempotency-key"]`` (mcp-idempotent): an explicit key with the proxy policy.
- none: derived from the tool name and canonical arguments, scoped to the proxy's run id.

``_meta`` is never part of a fingerprint: the stateless protocol puts per-request data there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import getpass
import hashlib
import json
import logging
import os
import signal
import stat
import sys
import uuid
from typing import TYPE_CHECKING, Any, Literal, Protocol

from idemstore.errors import (
    CanonicalizationError,
    ConfigurationError,
    IdemstoreError,
    InvalidKeyError,
)
from idemstore.hashing import fingerprint
from idemstore.protocol import Outcome
from idemstore.records import check_duration, check_identity
from idemstore.runner import _Heartbeat, _release_quietly

if TYPE_CHECKING:
    from collections.abc import Sequence

    from idemstore.protocol import IdempotencyStore, Lease

__all__ = [
    "ByteReader",
    "ByteWriter",
    "IdempotentProxy",
    "default_key_scope",
    "run_stdio_proxy",
]

logger = logging.getLogger("idemstore.mcp.proxy")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# SEP-3182 defines no code of its own (clients match error.data.type). The same codes as the
# server middleware (idemstore.mcp.server): other arguments are a client error in the params;
# a duplicate in flight is a request that cannot be served as sent.
CONFLICT_CODE = INVALID_PARAMS
IN_PROGRESS_CODE = INVALID_REQUEST
# Errors that mean the server refused the request before any tool ran: even under a SEP key
# they are not recorded, since nothing happened that a retry could duplicate.
_REFUSAL_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})

SEP_KEY_FIELD = "idempotencyKey"
META_KEY_FIELD = "idempotency-key"
# MRTR continuations (SEP-2322) are outside SEP-3182: relayed untouched, never deduplicated.
MRTR_FIELDS = ("requestState", "inputResponses")

_CHUNK = 256 * 1024
_DEFAULT_MAX_LINE = 256 * 1024 * 1024

KeyKind = Literal["sep", "meta", "derived"]


class ByteReader(Protocol):
    """What the proxy reads from: ``asyncio.StreamReader`` fits."""

    async def read(self, n: int = -1, /) -> bytes:
        """Up to ``n`` bytes; ``b""`` at end of stream."""
        ...


class ByteWriter(Protocol):
    """What the proxy writes to: ``asyncio.StreamWriter`` fits."""

    def write(self, data: bytes, /) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class _LineTooLong(Exception):
    pass


class _LineReader:
    """Newline-delimited messages up to ``limit`` bytes (asyncio's readline stops at 64 KiB)."""

    __slots__ = ("_buffer", "_eof", "_limit", "_reader", "_scanned")

    def __init__(self, reader: ByteReader, limit: int) -> None:
        self._reader = reader
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes already searched for a newline, so long lines stay O(n)
        self._eof = False

    async def readline(self) -> bytes:
        """The next line with its newline; the unterminated tail at EOF; ``b""`` after that.

        Raises ``_LineTooLong`` once a line past ``limit`` has been skipped whole.
        """
        while True:
            index = self._buffer.find(b"\n", self._scanned)
            if index >= 0:
                line = bytes(self._buffer[: index + 1])
                del self._buffer[: index + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                await self._skip_line()
                raise _LineTooLong
            if self._eof:
                line = bytes(self._buffer)
                self._buffer.clear()
                self._scanned = 0
                return line
            chunk = await self._reader.read(_CHUNK)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

    async def _skip_line(self) -> None:
        self._buffer.clear()
        self._scanned = 0
        while not self._eof:
            chunk = await self._reader.read(_CHUNK)
            if not chunk:
                self._eof = True
                return
            index = chunk.find(b"\n")
            if index >= 0:
                self._buffer += chunk[index + 1 :]
                return


class _ServerGone(Exception):
    pass


class _Call:
    """One intercepted ``tools/call`` from the client, from its first reserve to its answer."""

    __slots__ = (
        "answered",
        "cancelled",
        "fingerprint",
        "forward",
        "forwarded",
        "heartbeat",
        "id",
        "id_key",
        "key",
        "kind",
        "lease",
        "lost",
        "scope",
        "task",
    )

    def __init__(
        self,
        request_id: object,
        id_key: str,
        kind: KeyKind,
        key: str,
        scope: str,
        fingerprint: str,
        forward: bytes,
    ) -> None:
        self.id = request_id
        self.id_key = id_key
        self.kind = kind
        self.key = key
        self.scope = scope
        self.fingerprint = fingerprint
        self.forward = forward  # the bytes the server gets
        self.task: asyncio.Task[None] | None = None
        self.lease: Lease | None = None
        self.heartbeat: _Heartbeat | None = None
        self.forwarded = False
        self.answered = False
        self.cancelled = False
        self.lost = False


def _dumps(value: object) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (legal as a JSON escape) cannot be UTF-8: keep it escaped.
        return json.dumps(value, separators=(",", ":")).encode("ascii")


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _writable_id(request_id: object) -> bool:
    try:
        json.dumps(request_id, allow_nan=False)
    except ValueError:
        return False
    return True


def _id_key(request_id: object) -> str:
    return json.dumps(request_id, sort_keys=True)


def _error_line(
    request_id: object, code: int, message: str, data: dict[str, object] | None = None
) -> bytes:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + b"\n"


def _replay_line(request_id: object, stored: bytes) -> bytes:
    # ``stored`` is the object {"result": ...} or {"error": ...}: splice the retry's own id in
    # front of its members instead of decoding and re-encoding a possibly large result.
    return b'{"jsonrpc":"2.0","id":' + _dumps(request_id) + b"," + stored[1:] + b"\n"


def _outcome(message: dict[str, Any], kind: KeyKind) -> bytes | None:
    """The bytes to record for a server response, or ``None`` when the key must be released."""
    if "error" in message:
        # SEP-3182 replays errors too; a derived or _meta key lets the next retry run again.
        error = message["error"]
        refused = isinstance(error, dict) and error.get("code") in _REFUSAL_CODES
        return _dumps({"error": error}) if kind == "sep" and not refused else None
    if "result" not in message:
        return None
    result = message["result"]
    if isinstance(result, dict) and result.get("resultType") == "input_required":
        return None  # the exchange goes on in MRTR continuations; a replay would be stale
    return _dumps({"result": result})


def _with_idempotency_capability(message: dict[str, Any], line: bytes) -> bytes:
    result = message.get("result")
    capabilities = result.get("capabilities") if isinstance(result, dict) else None
    tools = capabilities.get("tools") if isinstance(capabilities, dict) else None
    # A server without tools has nothing to honour the SEP for; one that has the capability
    # already keeps its own bytes.
    if not isinstance(tools, dict) or "idempotency" in tools:
        return line
    tools["idempotency"] = {}
    return _dumps(message) + b"\n"


def default_key_scope(command: Sequence[str]) -> str:
    """The scope of explicit keys for a proxy in front of ``command``.

    Explicit keys outlive a proxy process (a client may retry through a restarted proxy, or
    through another instance sharing the store), so they are not scoped to the run id. They are
    scoped to the local user and the server command: proxies of one user in front of the same
    server share keys; other users and other servers never see them.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    server = hashlib.sha256(json.dumps(list(command)).encode("utf-8")).hexdigest()[:16]
    return f"mcp-proxy/keys/{user}/{server}"


class IdempotentProxy:
    """Relay one MCP client and one MCP server, deduplicating ``tools/call`` through ``store``.

    Args:
        store: any ``IdempotencyStore`` (shared ones let several proxies deduplicate together).
        run_id: scope of derived keys (default: a new UUID, i.e. one per proxy). Proxies that
            share a store and a run id deduplicate implicit calls between them.
        key_scope: scope of explicit keys (SEP-3182 and ``_meta``); see ``default_key_scope``.
        lease_ttl: seconds a call holds its key without a heartbeat; heartbeats run every third.
        retention: seconds a recorded outcome is replayed.
        in_flight: for derived and ``_meta`` keys, ``"wait"`` for a running original and return
            its result, or ``"reject"`` at once. SEP-3182 keys always reject.
        implicit: derive keys for calls that carry none (``False``: only explicit keys).
        tools: glob patterns of the tools that get derived keys (default: all). Explicit keys
            are always honoured.
        exclude_tools: glob patterns of the tools that never get derived keys.
        max_line_bytes: longest message accepted; a longer one is skipped and answered with an
            error.

    Example:
        ```python
        async with open_store("memory://") as store:
            proxy = IdempotentProxy(store)
            await proxy.run(client_reader=r1, client_writer=w1,
                            server_reader=r2, server_writer=w2)
        ```
    """

    __slots__ = (
        "_calls",
        "_capability_requests",
        "_client_lock",
        "_client_writer",
        "_exclude_tools",
        "_implicit",
        "_in_flight",
        "_key_scope",
        "_lease_ttl",
        "_max_line",
        "_retention",
        "_run_scope",
        "_server_closed",
        "_server_lock",
        "_server_writer",
        "_store",
        "_tools",
        "client_closed",
        "run_id",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        run_id: str | None = None,
        key_scope: str = "mcp-proxy/keys",
        lease_ttl: float = 30.0,
        retention: float = 86400.0,
        in_flight: Literal["wait", "reject"] = "wait",
        implicit: bool = True,
        tools: Sequence[str] = ("*",),
        exclude_tools: Sequence[str] = (),
        max_line_bytes: int = _DEFAULT_MAX_LINE,
    ) -> None:
        if in_flight not in ("wait", "reject"):
            raise ConfigurationError(f"in_flight must be 'wait' or 'reject', not {in_flight!r}")
        if max_line_bytes < 1:
            raise ConfigurationError(f"max_line_bytes must be positive, not {max_line_bytes!r}")
        self._store = store
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex
        self._run_scope = f"mcp-proxy/run/{self.run_id}"
        self._key_scope = key_scope
        try:
            check_identity("k", self._run_scope)
            check_identity("k", key_scope)
        except IdemstoreError as exc:
            raise ConfigurationError(f"bad run id or key scope: {exc}") from None
        self._lease_ttl = check_duration("lease_ttl", lease_ttl)
        self._retention = check_duration("retention", retention)
        self._in_flight = in_flight
        self._implicit = implicit
        self._tools = tuple(tools)
        self._exclude_tools = tuple(exclude_tools)
        self._max_line = max_line_bytes
        self._calls: dict[str, _Call] = {}
        self._capability_requests: set[str] = set()
        self._client_writer: ByteWriter | None = None
        self._server_writer: ByteWriter | None = None
        self._client_lock = asyncio.Lock()
        self._server_lock = asyncio.Lock()
        self._server_closed = False
        self.client_closed = asyncio.Event()
        """Set once the client's stream ended and the server's input was closed."""

    async def run(
        self,
        *,
        client_reader: ByteReader,
        client_writer: ByteWriter,
        server_reader: ByteReader,
        server_writer: ByteWriter,
    ) -> None:
        """Relay until the server's output ends; then answer what is pending and return.

        When the client's stream ends first, the server's input is closed once every
        intercepted call has been forwarded or answered, and the relay goes on until the
        server's output ends.
        """
        self._client_writer = client_writer
        self._server_writer = server_writer
        client = asyncio.create_task(self._pump_client(client_reader), name="mcp-proxy:client")
        try:
            await self._pump_server(server_reader)
        finally:
            self._server_closed = True
            # Take the pending calls before stopping the client pump: its cancellation also
            # cancels the calls it is waiting for, and each of those still needs an answer.
            calls = list(self._calls.values())
            self._calls.clear()
            client.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client
            await self._abandon(calls)

    # -- client to server -----------------------------------------------------------------

    async def _pump_client(self, reader: ByteReader) -> None:
        lines = _LineReader(reader, self._max_line)
        while True:
            try:
                line = await lines.readline()
            except _LineTooLong:
                logger.warning("skipped a client message over %d bytes", self._max_line)
                message = f"message larger than {self._max_line} bytes"
                await self._send_client(_error_line(None, INVALID_REQUEST, message))
                continue
            if not line:
                break
            try:
                await self._on_client_line(line)
            except _ServerGone:
                logger.debug("server input closed; dropped a client message")
            except Exception:
                # Whatever a message holds, the relay goes on.
                logger.exception("could not handle a client message; it was dropped")
        pending = [c.task for c in list(self._calls.values()) if c.task and not c.task.done()]
        await asyncio.gather(*pending, return_exceptions=True)
        if self._server_writer is not None:
            with contextlib.suppress(Exception):
                self._server_writer.close()
        self.client_closed.set()

    async def _on_client_line(self, line: bytes) -> None:
        message = _parse(line)
        if isinstance(message, dict):
            method = message.get("method")
            has_id = "id" in message and message["id"] is not None
            if method == "tools/call" and has_id and await self._intercept(message, line):
                return
            if method in ("initialize", "server/discover") and has_id:
                self._capability_requests.add(_id_key(message["id"]))
            elif method == "notifications/cancelled" and await self._on_cancelled(message):
                return
        await self._send_server(line)

    def _derives_key(self, name: str) -> bool:
        if not self._implicit:
            return False
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in self._tools):
            return False
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self._exclude_tools)

    async def _intercept(self, message: dict[str, Any], line: bytes) -> bool:
        """Take a ``tools/call`` over; ``False`` leaves it to be relayed untouched."""
        params = message.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return False  # malformed: the server answers it
        if any(field in params for field in MRTR_FIELDS):
            return False
        request_id = message["id"]
        name: str = params["name"]
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        meta = params.get("_meta")
        kind: KeyKind
        forward = line
        if SEP_KEY_FIELD in params:
            kind, key = "sep", params[SEP_KEY_FIELD]
            stripped = {k: v for k, v in params.items() if k != SEP_KEY_FIELD}
            forward = _dumps({**message, "params": stripped}) + b"\n"
        elif isinstance(meta, dict) and META_KEY_FIELD in meta:
            kind, key = "meta", meta[META_KEY_FIELD]
        elif self._derives_key(name):
            kind, key = "derived", ""
        else:
            return False
        if not _writable_id(request_id):
            # NaN or Infinity (non-standard JSON, or a literal like 1e400): no JSON answer can
            # carry this id, so answer as JSON-RPC does when the id cannot be read.
            message_text = "the request id is not a JSON value (NaN or Infinity)"
            await self._send_client(_error_line(None, INVALID_REQUEST, message_text))
            return True
        if not isinstance(arguments, dict):
            if kind == "derived":
                return False  # the server answers it as it would without the proxy
            await self._reject_invalid(request_id, kind, key, "arguments must be an object")
            return True
        if not isinstance(key, str):
            await self._reject_invalid(request_id, kind, key, "the key must be a string")
            return True
        try:
            print_ = fingerprint({"name": name, "arguments": arguments})
        except CanonicalizationError as exc:
            if kind == "derived":
                logger.warning("call of %r relayed without a key: %s", name, exc)
                return False
            await self._reject_invalid(request_id, kind, key, f"arguments are not JSON: {exc}")
            return True
        if kind == "derived":
            key, scope = f"{name}:{print_}", self._run_scope
            try:
                check_identity(key, scope)
            except IdemstoreError:
                key = f"sha256:{print_}"  # a tool name too long (or odd) for a key
        else:
            scope = self._key_scope
            try:
                check_identity(key, scope)
            except IdemstoreError as exc:
                await self._reject_invalid(request_id, kind, key, str(exc))
                return True
        id_key = _id_key(request_id)
        if id_key in self._calls:
            message_text = f"request id {request_id!r} is already in use by a pending call"
            await self._send_client(_error_line(request_id, INVALID_REQUEST, message_text))
            return True
        call = _Call(request_id, id_key, kind, key, scope, print_, forward)
        self._calls[id_key] = call
        call.task = asyncio.create_task(self._run_call(call), name=f"mcp-proxy:call:{id_key}")
        return True

    async def _reject_invalid(
        self, request_id: object, kind: KeyKind, key: object, why: str
    ) -> None:
        field = {"sep": SEP_KEY_FIELD, "meta": f"_meta.{META_KEY_FIELD}"}.get(kind, "arguments")
        data: dict[str, object] = {"type": "idempotency_key_invalid"}
        if isinstance(key, str) and key:
            data["idempotencyKey"] = key
        message = f"invalid {field}: {why}"
        await self._send_client(_error_line(request_id, INVALID_PARAMS, message, data))

    async def _run_call(self, call: _Call) -> None:
        """Reserve the key, then forward, replay, reject, or wait and try again."""
        try:
            while True:
                try:
                    reservation = await self._store.reserve(
                        call.key,
                        call.fingerprint,
                        scope=call.scope,
                        lease_ttl=self._lease_ttl,
                        retention=self._retention,
                    )
                except Exception as exc:
                    await self._answer_store_error(call, exc)
                    return
                if reservation.outcome is Outcome.ACQUIRED:
                    assert reservation.lease is not None
                    await self._forward(call, reservation.lease)
                    return
                record = reservation.record
                assert record is not None
                if reservation.outcome is Outcome.COMPLETED:
                    assert record.response is not None
                    logger.info("replayed %s key %r (fence %d)", call.kind, call.key, record.fence)
                    await self._answer(call, _replay_line(call.id, record.response))
                    return
                if reservation.outcome is Outcome.MISMATCH:
                    await self._answer_error(
                        call,
                        CONFLICT_CODE,
                        f"idempotency key {call.key!r} was already used with different arguments",
                        "idempotency_key_conflict",
                    )
                    return
                if call.kind == "sep" or self._in_flight == "reject":
                    await self._answer_error(
                        call,
                        IN_PROGRESS_CODE,
                        f"a call with idempotency key {call.key!r} is in progress; retry shortly",
                        "idempotency_key_in_progress",
                    )
                    return
                # The store wakes us when the original completes, is released, or its lease
                # lapses; reserve again then decides (replay, run, or keep waiting).
                try:
                    await self._store.wait(call.key, scope=call.scope, timeout=self._lease_ttl)
                except Exception as exc:
                    await self._answer_store_error(call, exc)
                    return
        finally:
            if not call.forwarded and self._calls.get(call.id_key) is call:
                del self._calls[call.id_key]

    async def _forward(self, call: _Call, lease: Lease) -> None:
        if self._server_closed:
            await _release_quietly(self._store, lease)
            await self._answer_server_gone(call)
            return
        call.lease = lease
        call.forwarded = True
        call.heartbeat = _Heartbeat(self._store, lease, self._lease_ttl)
        try:
            await self._send_server(call.forward)
        except _ServerGone:
            # The server's output ends too; run() then answers this call and releases its key.
            logger.warning("could not forward call %s: the server's input is closed", call.id_key)

    async def _on_cancelled(self, message: dict[str, Any]) -> bool:
        """Apply the client's cancellation; ``True`` when the server must not see it."""
        params = message.get("params")
        if not isinstance(params, dict) or "requestId" not in params:
            return False
        call = self._calls.get(_id_key(params["requestId"]))
        if call is None:
            return False
        if not call.forwarded:
            # The server never saw this request: stop waiting and tell nobody.
            call.answered = True
            if call.task is not None:
                call.task.cancel()
            return True
        call.cancelled = True
        await self._stop_heartbeat(call)
        if call.kind == "sep":
            # The server may be executing the side effect right now, and SEP-3182 forbids a
            # second execution while the original runs: keep the key until the server answers
            # (the outcome is recorded) or, if it never does, until the lease lapses.
            loop = asyncio.get_running_loop()
            loop.call_later(self._lease_ttl, self._forget, call)
        else:
            del self._calls[call.id_key]
            if call.lease is not None:
                await _release_quietly(self._store, call.lease)
            logger.info("released %s key %r: the client cancelled the call", call.kind, call.key)
        return False

    def _forget(self, call: _Call) -> None:
        if self._calls.get(call.id_key) is call:
            del self._calls[call.id_key]

    async def _send_server(self, data: bytes) -> None:
        writer = self._server_writer
        assert writer is not None
        async with self._server_lock:
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise _ServerGone from exc

    # -- server to client -----------------------------------------------------------------

    async def _pump_server(self, reader: ByteReader) -> None:
        lines = _LineReader(reader, self._max_line)
        while True:
            try:
                line = await lines.readline()
            except _LineTooLong:
                logger.error("dropped a server message over %d bytes", self._max_line)
                continue
            if not line:
                return
            try:
                await self._on_server_line(line)
            except Exception:
                logger.exception("could not handle a server message; it was dropped")

    async def _on_server_line(self, line: bytes) -> None:
        if not self._calls and not self._capability_requests:
            await self._send_client(line)  # nothing to match: do not even parse
            return
        message = _parse(line)
        if isinstance(message, dict) and "method" not in message and "id" in message:
            id_key = _id_key(message["id"])
            call = self._calls.get(id_key)
            if call is not None and call.forwarded:
                await self._finish(call, message, line)
                return
            if id_key in self._capability_requests:
                self._capability_requests.discard(id_key)
                line = _with_idempotency_capability(message, line)
        await self._send_client(line)

    async def _finish(self, call: _Call, message: dict[str, Any], line: bytes) -> None:
        del self._calls[call.id_key]
        await self._stop_heartbeat(call)
        lease = call.lease
        assert lease is not None
        # Only SEP calls are still here after a cancellation: they record what the server did.
        stored = _outcome(message, call.kind)
        if stored is None:
            await _release_quietly(self._store, lease)
        else:
            await self._complete(lease, stored)
        # The original's response goes out as the server wrote it (its id is the client's).
        await self._answer(call, line)

    async def _abandon(self, calls: list[_Call]) -> None:
        """The server is gone: answer every pending call with an error and free its key."""
        waiting = [c.task for c in calls if c.task is not None and not c.task.done()]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for call in calls:
            await self._stop_heartbeat(call)
            if call.forwarded and call.lease is not None:
                await _release_quietly(self._store, call.lease)
            if not call.cancelled:
                await self._answer_server_gone(call)

    # -- answers and store operations -----------------------------------------------------

    async def _answer(self, call: _Call, line: bytes) -> None:
        if call.answered:
            return
        call.answered = True
        await self._send_client(line)

    async def _answer_error(self, call: _Call, code: int, message: str, kind: str) -> None:
        data: dict[str, object] = {"type": kind, "idempotencyKey": call.key}
        await self._answer(call, _error_line(call.id, code, message, data))

    async def _answer_store_error(self, call: _Call, exc: Exception) -> None:
        if isinstance(exc, InvalidKeyError):  # this store's own key limits are narrower
            data: dict[str, object] = {
                "type": "idempotency_key_invalid",
                "idempotencyKey": call.key,
            }
            line = _error_line(call.id, INVALID_PARAMS, f"invalid idempotency key: {exc}", data)
            await self._answer(call, line)
            return
        # Fail closed: without the store the proxy cannot tell a retry from a first call.
        logger.error("idempotency store failed for %s key %r: %s", call.kind, call.key, exc)
        message = f"idempotency store unavailable, the call was not run: {exc}"
        await self._answer(
            call,
            _error_line(
                call.id,
                INTERNAL_ERROR,
                message,
                {"type": "idempotency_store_unavailable", "idempotencyKey": call.key},
            ),
        )

    async def _answer_server_gone(self, call: _Call) -> None:
        message = "the MCP server exited before answering; the call may or may not have run"
        await self._answer(
            call, _error_line(call.id, INTERNAL_ERROR, message, {"type": "mcp_server_exited"})
        )

    async def _send_client(self, data: bytes) -> None:
        writer = self._client_writer
        assert writer is not None
        async with self._client_lock:
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, RuntimeError, ValueError):
                logger.debug("client output closed; dropped %d bytes", len(data))

    @staticmethod
    async def _stop_heartbeat(call: _Call) -> None:
        """Stop extending the call's lease; ``call.lease`` is then the latest one."""
        heartbeat, call.heartbeat = call.heartbeat, None
        if heartbeat is not None:
            await heartbeat.stop()
            call.lease = heartbeat.lease

    async def _complete(self, lease: Lease, stored: bytes) -> None:
        try:
            if not await self._store.complete(lease, stored):
                logger.warning("key %r was taken over; its outcome is not stored", lease.key)
        except Exception:
            logger.warning("could not store the outcome of key %r", lease.key, exc_info=True)


# -- the stdio shell the CLI runs ------------------------------------------------------------


class _FileReader:
    """A blocking file descriptor read in a thread (stdin that is a regular file)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, n: int = -1, /) -> bytes:
        return await asyncio.to_thread(os.read, self._fd, n if n > 0 else _CHUNK)


class _FileWriter:
    """A blocking file descriptor written in a thread (stdout that is a regular file)."""

    __slots__ = ("_fd", "_pending")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending = bytearray()

    def write(self, data: bytes, /) -> None:
        self._pending += data

    async def drain(self) -> None:
        data, self._pending = bytes(self._pending), bytearray()
        view = memoryview(data)
        while view:
            written = await asyncio.to_thread(os.write, self._fd, view)
            view = view[written:]

    def close(self) -> None:
        pass


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch ``fd``: pipes, sockets, terminals (not files, /dev/null)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


async def _stdio() -> tuple[ByteReader, ByteWriter]:
    loop = asyncio.get_running_loop()
    reader: ByteReader
    writer: ByteWriter
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if _pollable(stdin):
        stream = asyncio.StreamReader(limit=_CHUNK)
        pipe = os.fdopen(stdin, "rb", buffering=0, closefd=False)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
        reader = stream
    else:
        reader = _FileReader(stdin)
    if _pollable(stdout):
        pipe = os.fdopen(stdout, "wb", buffering=0, closefd=False)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    else:
        writer = _FileWriter(stdout)
    return reader, writer


async def run_stdio_proxy(
    proxy: IdempotentProxy, command: Sequence[str], *, shutdown_grace: float = 5.0
) -> int:
    """Start ``command`` as the MCP server and relay this process's stdin/stdout to it.

    Returns the server's exit status (``128 + N`` when a signal N ended it). SIGINT and SIGTERM
    are passed on to the server. When the client closes stdin, the server's stdin is closed
    and it gets ``shutdown_grace`` seconds to exit before SIGTERM, then as long before SIGKILL.
    """
    if not command:
        raise ConfigurationError("no server command: idemstore proxy [options] -- CMD [ARGS ...]")
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_CHUNK,
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot start the MCP server {command[0]!r}: {exc}") from None
    assert process.stdin is not None and process.stdout is not None
    client_reader, client_writer = await _stdio()
    loop = asyncio.get_running_loop()

    def pass_on(signum: int) -> None:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, pass_on, signum)
            handled.append(signum)

    async def stop_server() -> None:
        for step in (None, process.terminate, process.kill):
            if step is not None:
                with contextlib.suppress(ProcessLookupError):
                    step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), shutdown_grace)
                return

    async def stop_after_client() -> None:
        await proxy.client_closed.wait()
        await stop_server()

    reaper = asyncio.create_task(stop_after_client(), name="mcp-proxy:reaper")
    try:
        await proxy.run(
            client_reader=client_reader,
            client_writer=client_writer,
            server_reader=process.stdout,
            server_writer=process.stdin,
        )
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        if process.returncode is None:
            await stop_server()
        for signum in handled:
            loop.remove_signal_handler(signum)
    code = process.returncode
    assert code is not None
    return 128 - code if code < 0 else code
