"""The transport-neutral core of an MCP relay that deduplicates ``tools/call``.

A relay (the stdio proxy in ``idemstore.mcp.proxy``, a Streamable HTTP gateway) owns its
transport: it reads client messages, writes server messages, and matches responses to
requests. Everything about ``tools/call`` idempotency is here, so every relay behaves alike:

1. ``core.note_request(message)`` for every client request: the core remembers the ids of
   ``initialize``, ``server/discover`` and ``tools/list`` so their responses can be read.
2. ``core.prepare(message, line)`` for a ``tools/call``: ``None`` (relay it untouched: no key,
   an MRTR continuation, malformed params the server answers), ``bytes`` (answer the client
   with these bytes at once: an invalid key), or a ``ToolCall`` to run.
3. ``core.start(call, exchange)`` runs a ``ToolCall`` through the one execution path
   (``idemstore.execution``) and returns a task whose result is the bytes to send the client
   (``None``: send nothing). ``exchange(forward)`` is the relay's: send ``forward`` (the bytes
   the server gets: the SEP key stripped) and return the server's final response as a
   ``ServerResponse``, or raise ``ServerGone``. With ``reply``, the task sends the answer
   itself. ``core.close()`` ends every pending call when the relay stops (keys released).
4. ``core.cancel(request_id)`` for a client's ``notifications/cancelled``: ``True`` when the
   server saw the request and must get the notification too.
5. ``core.on_response(message, line)`` for every server response: the bytes to relay (the
   ``tools.idempotency`` capability added to ``initialize`` / ``server/discover`` results;
   ``tools/list`` results are read for ``readOnlyHint`` and relayed byte for byte).

Keys, in this order: ``params.idempotencyKey`` (SEP-3182: a duplicate in flight is rejected,
other arguments are a conflict, results *and* errors replay, retention ``sep_retention``);
``params._meta["idempotency-key"]`` (mcp-idempotent's explicit key); none: a key derived from
the tool name and canonical arguments, scoped to the run id. Explicit keys are scoped to
``key_scope``. Derived and ``_meta`` keys follow mcp-idempotent: only results (not JSON-RPC
errors) are recorded, remembered ``retention`` seconds (default 600), and a duplicate in flight
waits for the original (``in_flight="wait"``). A tool whose ``tools/list`` entry says
``readOnlyHint: true`` never gets a derived key (it must return fresh data) unless
``dedupe_read_only``.

Cancellation: a call cancelled before it reached the server is dropped (a reserve in flight
leaves no lease behind). A forwarded call keeps its key while it is in flight at the server:
a SEP key keeps its lease alive (SEP-3182 forbids a second execution while the original runs)
until the server answers (that outcome is recorded), the server goes away, or
``cancel_grace`` seconds pass without an answer (MCP servers do not answer a cancelled
request; then the key is released). A derived or ``_meta`` key is released at once, as in
mcp-idempotent. A late answer to a cancelled call is relayed as the server wrote it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from idemstore.eager_tasks import start_task
from idemstore.errors import (
    CanonicalizationError,
    ConfigurationError,
    ConflictError,
    IdemstoreError,
    InProgressError,
    InvalidKeyError,
)
from idemstore.execution import ExecutionPolicy, Replay
from idemstore.hashing import fingerprint
from idemstore.mcp import json_splice, sep3182
from idemstore.mcp.outcome_policy import KeyKind, decide
from idemstore.records import check_duration, check_identity

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Sequence

    from idemstore.execution import Execution
    from idemstore.protocol import IdempotencyStore

__all__ = [
    "META_KEY_FIELD",
    "Answer",
    "Forward",
    "KeyKind",
    "ServerGone",
    "ServerResponse",
    "ToolCall",
    "ToolCallCore",
    "dumps",
    "error_line",
    "id_key",
]

logger = logging.getLogger("idemstore.mcp.tool_calls")

META_KEY_FIELD = "idempotency-key"
"""mcp-idempotent's explicit key: ``params._meta["idempotency-key"]``."""

_META_FIELD = f"_meta.{META_KEY_FIELD}"
_SELECTED_CACHE = 1024  # tool names whose selection by the globs is remembered


class ServerGone(Exception):
    """Raised by an exchange: the server cannot answer (it exited, or its input is closed)."""


@dataclass(frozen=True, slots=True)
class ServerResponse:
    """The server's final response to a forwarded call: parsed, and its own bytes."""

    message: dict[str, Any]
    line: bytes


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An intercepted ``tools/call``: what ``ToolCallCore.start`` runs."""

    request_id: object
    id_key: str
    kind: KeyKind
    key: str
    scope: str
    fingerprint: str
    name: str
    forward: bytes  # the bytes the server gets


@dataclass(frozen=True, slots=True)
class Answer:
    """``prepare``'s verdict: answer the client with ``line`` at once; the server gets nothing."""

    line: bytes


@dataclass(frozen=True, slots=True)
class Forward:
    """``prepare``'s verdict: relay ``line`` to the server without a key (nothing to run)."""

    line: bytes


@dataclass(slots=True)
class _Pending:
    call: ToolCall
    task: asyncio.Task[bytes | None] | None = None
    forwarded: bool = False
    execution: Execution | None = None
    cancelled: bool = False
    sent: bool = False  # forwarded, or answered
    # Made only when wait_forwarded() has to wait: most calls are sent before anyone asks.
    sent_event: asyncio.Event | None = None

    def mark_sent(self) -> None:
        self.sent = True
        if self.sent_event is not None:
            self.sent_event.set()

    def wait_sent(self) -> Coroutine[Any, Any, Literal[True]]:
        if self.sent_event is None:
            self.sent_event = asyncio.Event()
            if self.sent:
                self.sent_event.set()
        return self.sent_event.wait()


# Encoders made once: json.dumps with any option builds a new JSONEncoder on every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))
_SORTED = json.JSONEncoder(sort_keys=True)


def dumps(value: object) -> bytes:
    """Compact JSON bytes (UTF-8; a lone surrogate stays escaped)."""
    try:
        return _COMPACT.encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(value).encode("ascii")


def id_key(request_id: object) -> str:
    """A hashable identity for a JSON-RPC id (``1`` and ``"1"`` differ)."""
    if type(request_id) is int:
        return int.__repr__(request_id)  # what json.dumps writes for an int
    return _SORTED.encode(request_id)


def error_line(request_id: object, error: dict[str, Any]) -> bytes:
    """A JSON-RPC error response line for ``request_id``."""
    return dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + b"\n"


def _replay_line(request_id: object, stored: bytes) -> bytes:
    # The retry's own id and the replay marker spliced into the recorded bytes (json_splice).
    try:
        return json_splice.replay_line(dumps(request_id), stored, sep3182.REPLAYED_META_KEY)
    except ValueError as exc:
        logger.error("a recorded outcome is unreadable: %s", exc)
        why = "the recorded outcome of this idempotency key is unreadable"
        return error_line(request_id, sep3182.error(sep3182.INTERNAL_ERROR, why))


_STRICT = json.JSONEncoder(allow_nan=False)


def _writable_id(request_id: object) -> bool:
    try:
        if type(request_id) is int:
            int.__repr__(request_id)  # what json writes; only too many digits fail
        elif type(request_id) is not str:  # a str is always writable (escaped as needed)
            _STRICT.encode(request_id)
    except ValueError:
        return False
    return True


def _server_exited(request_id: object) -> bytes:
    why = "the MCP server exited before answering; the call may or may not have run"
    return error_line(request_id, sep3182.error(sep3182.INTERNAL_ERROR, why, sep3182.SERVER_EXITED))


def _outcome(response: ServerResponse, kind: KeyKind) -> bytes | None:
    """The bytes to record for a server response, or ``None`` when the key must be released."""
    if decide(response.message, kind) == "release":
        return None
    try:
        return json_splice.recorded(response.line)  # the server's bytes: replays stay exact
    except ValueError as exc:
        logger.warning("response not recorded, its bytes are not one JSON object: %s", exc)
        return None


class ToolCallCore:
    """``tools/call`` idempotency for one relay; see the module docstring for the protocol.

    Args:
        store: any ``IdempotencyStore`` (shared ones let several relays deduplicate together).
        run_id: scope of derived keys (default: a new UUID, one per relay instance).
        key_scope: scope of explicit keys (SEP-3182 and ``_meta``).
        lease_ttl: seconds a call holds its key without a heartbeat (heartbeats every third).
        retention: seconds a derived or ``_meta`` key's result is replayed (default 600).
        sep_retention: seconds a SEP-3182 key's outcome is replayed (default 86400).
        in_flight: derived and ``_meta`` keys: ``"wait"`` for a running original, or
            ``"reject"``. SEP-3182 keys always reject.
        implicit: derive keys for calls that carry none.
        tools / exclude_tools: glob patterns of the tools that get / never get derived keys.
        dedupe_read_only: derive keys for tools annotated ``readOnlyHint: true`` too.
        cancel_grace: seconds a cancelled, forwarded SEP call keeps its key without an answer.
    """

    __slots__ = (
        "_cancel_grace",
        "_closing",
        "_dedupe_read_only",
        "_exclude_tools",
        "_implicit",
        "_key_scope",
        "_pending",
        "_policy",
        "_read_only",
        "_run_scope",
        "_selected",
        "_sep_policy",
        "_tasks",
        "_tools",
        "_watch",
        "run_id",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        run_id: str | None = None,
        key_scope: str = "mcp-proxy/keys",
        lease_ttl: float = 30.0,
        retention: float = 600.0,
        sep_retention: float = 86400.0,
        in_flight: Literal["wait", "reject"] = "wait",
        implicit: bool = True,
        tools: Sequence[str] = ("*",),
        exclude_tools: Sequence[str] = (),
        dedupe_read_only: bool = False,
        cancel_grace: float = 60.0,
        consumer: str = "mcp_proxy",
    ) -> None:
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex
        self._run_scope = f"mcp-proxy/run/{self.run_id}"
        self._key_scope = key_scope
        try:
            check_identity("k", self._run_scope)
            check_identity("k", key_scope)
        except IdemstoreError as exc:
            raise ConfigurationError(f"bad run id or key scope: {exc}") from None
        # consumer names the transport in telemetry (idemstore.consumer): the stdio proxy, or
        # the HTTP gateway that shares this core.
        self._policy = ExecutionPolicy(
            store, lease_ttl=lease_ttl, retention=retention, in_flight=in_flight, consumer=consumer
        )
        self._sep_policy = ExecutionPolicy(
            store,
            lease_ttl=lease_ttl,
            retention=sep_retention,
            in_flight="reject",
            consumer=consumer,
        )
        self._cancel_grace = check_duration("cancel_grace", cancel_grace)
        self._implicit = implicit
        self._tools = tuple(tools)
        self._exclude_tools = tuple(exclude_tools)
        self._dedupe_read_only = dedupe_read_only
        self._read_only: dict[str, bool] = {}
        self._selected: dict[str, bool] = {}  # _select's answers by tool name
        self._watch: dict[str, str] = {}
        self._pending: dict[str, _Pending] = {}
        # Call tasks until their very end (answering included); kept here rather than by a
        # done callback, which would cost every call one more turn of the event loop.
        self._tasks: set[asyncio.Task[bytes | None]] = set()
        self._closing = False

    @property
    def busy(self) -> bool:
        """Whether any response may need the core (else a relay may pass it unparsed)."""
        return bool(self._pending or self._watch)

    @property
    def tasks(self) -> set[asyncio.Task[bytes | None]]:
        """The tasks of started calls that have not ended yet (a copy)."""
        return set(self._tasks)

    def is_read_only(self, name: str) -> bool:
        """Whether the server's ``tools/list`` said ``readOnlyHint: true`` for tool ``name``."""
        return self._read_only.get(name, False)

    # -- client to server ----------------------------------------------------------------

    def note_request(self, message: dict[str, Any]) -> None:
        """Remember a request whose response the core reads (capability, annotations)."""
        method = message.get("method")
        if method in ("initialize", "server/discover", "tools/list"):
            request_id = message.get("id")
            if request_id is not None:
                self._watch[id_key(request_id)] = str(method)

    def _derives_key(self, name: str) -> bool:
        selected = self._selected.get(name)
        if selected is None:
            selected = self._select(name)
            if len(self._selected) >= _SELECTED_CACHE:
                self._selected.clear()  # bounded: clients name tools at will
            self._selected[name] = selected
        # Not cached: the read-only hints change as tools/list answers are read.
        return selected and (self._dedupe_read_only or not self.is_read_only(name))

    def _select(self, name: str) -> bool:
        """Whether the options pick tool ``name`` for derived keys (the globs: fixed)."""
        if not self._implicit:
            return False
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in self._tools):
            return False
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self._exclude_tools)

    def prepare(self, message: dict[str, Any], line: bytes) -> ToolCall | Answer | Forward:
        """Classify a client ``tools/call``: run it, ``Answer`` it, or ``Forward`` it as is.

        A ``Forward`` carries the client's own bytes, except that a ``null`` SEP key is dropped
        (read as absent, and a strict server rejects params it does not know).
        """
        params = message.get("params")
        request_id = message.get("id")
        if request_id is None or not isinstance(params, dict):
            return Forward(line)
        name = params.get("name")
        if not isinstance(name, str) or sep3182.is_continuation(params):
            return Forward(line)  # malformed (the server answers it) or an MRTR continuation
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        meta = params.get("_meta")
        kind: KeyKind
        key: object
        forward = line
        sep_key = sep3182.key_of(params)  # null reads as absent
        if sep3182.KEY_FIELD in params:
            # The server does not know the field (null included): strip it before forwarding.
            stripped = {k: v for k, v in params.items() if k != sep3182.KEY_FIELD}
            forward = dumps({**message, "params": stripped}) + b"\n"
        if sep_key is not None:
            kind, key = "sep", sep_key
        elif isinstance(meta, dict) and meta.get(META_KEY_FIELD) is not None:
            kind, key = "meta", meta[META_KEY_FIELD]
        elif self._derives_key(name):
            kind, key = "derived", ""
        else:
            return Forward(forward)
        if not _writable_id(request_id):
            # NaN or Infinity: no JSON answer can carry this id; answer as for an unreadable id.
            why = "the request id is not a JSON value (NaN or Infinity)"
            return Answer(error_line(None, sep3182.error(sep3182.INVALID_REQUEST, why)))
        field_name = sep3182.KEY_FIELD if kind == "sep" else _META_FIELD if kind == "meta" else None
        if not isinstance(arguments, dict):
            if kind == "derived":
                return Forward(forward)  # the server answers it as it would without the relay
            why = "arguments must be an object"
            return Answer(error_line(request_id, sep3182.invalid_key_error(key, why, "arguments")))
        if not isinstance(key, str):
            why = "the key must be a string"
            error = sep3182.invalid_key_error(key, why, str(field_name))
            return Answer(error_line(request_id, error))
        try:
            print_ = fingerprint({"name": name, "arguments": arguments})
        except CanonicalizationError as exc:
            if kind == "derived":
                logger.warning("call of %r relayed without a key: %s", name, exc)
                return Forward(forward)
            why = f"arguments are not JSON: {exc}"
            return Answer(error_line(request_id, sep3182.invalid_key_error(key, why, "arguments")))
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
                error = sep3182.invalid_key_error(key, str(exc), str(field_name))
                return Answer(error_line(request_id, error))
        identity = id_key(request_id)
        if identity in self._pending:
            why = f"request id {request_id!r} is already in use by a pending call"
            return Answer(error_line(request_id, sep3182.error(sep3182.INVALID_REQUEST, why)))
        return ToolCall(request_id, identity, kind, key, scope, print_, name, forward)

    def start(
        self,
        call: ToolCall,
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
        reply: Callable[[bytes], Awaitable[None]] | None = None,
        *,
        admit_replay: Callable[[], Awaitable[bool]] | None = None,
    ) -> asyncio.Task[bytes | None]:
        """Run ``call``; the task's result is what to send the client (``None``: nothing).

        With ``reply``, the task sends that answer itself (``reply(line)``) and returns it,
        which saves a relay a task per call; a call still pending when ``close()`` runs is then
        answered with a ``mcp_server_exited`` error. ``admit_replay``, when given, is asked
        before a recorded outcome is served: ``False`` serves nothing (the relay answered the
        client itself, e.g. with the upstream's refusal of a revoked credential).
        """
        pending = _Pending(call)
        self._pending[call.id_key] = pending
        # Eager where Python allows: a call whose store answers inline is then forwarded
        # (or answered) before this returns, without waiting for the next turn of the loop.
        task = start_task(
            self._reply(pending, exchange, reply, admit_replay),
            name=f"mcp-relay:call:{call.id_key}",
        )
        if not task.done():
            pending.task = task
            self._tasks.add(task)
        return task

    def cancel(self, request_id: object) -> bool:
        """Apply a client's cancellation; ``True`` when the server must get it too."""
        pending = self._pending.get(id_key(request_id))
        if pending is None:
            return True  # not a call the core holds: the server's business
        task = pending.task
        if not pending.forwarded or task is None:
            # The server never saw this request: stop reserving or waiting, tell nobody.
            if task is not None:
                task.cancel()
                # A task cancelled before its first step runs none of its body (its finally
                # blocks included): settle its bookkeeping here, so that neither the relay's
                # shutdown (wait_forwarded) nor the task set waits for it.
                task.add_done_callback(self._tasks.discard)
                pending.mark_sent()
                self._forget(pending)
            return False
        if pending.cancelled:
            return True
        pending.cancelled = True
        call = pending.call
        if call.kind == "sep":
            logger.info(
                "call with SEP key %r cancelled: its key stays held while in flight", call.key
            )
        elif pending.execution is not None and not pending.execution.finished:
            execution = pending.execution
            self._spawn(execution.release(), f"release {call.key!r}")
            logger.info("released %s key %r: the client cancelled the call", call.kind, call.key)
        loop = asyncio.get_running_loop()
        loop.call_later(self._cancel_grace, self._give_up, task)
        return True

    @staticmethod
    def _give_up(task: asyncio.Task[bytes | None]) -> None:
        # A cancelled call the server never answered (MCP servers need not): stop keeping it.
        if not task.done():
            task.cancel()

    @staticmethod
    def _spawn(coroutine: Awaitable[None], what: str) -> None:
        async def run() -> None:
            try:
                await coroutine
            except Exception:
                logger.warning("could not %s", what, exc_info=True)

        task = asyncio.ensure_future(run())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)

    async def wait_forwarded(self) -> None:
        """Return once every started call has been forwarded to the server or answered."""
        while True:
            waiting = [p.wait_sent() for p in self._pending.values() if not p.sent]
            if not waiting:
                return
            await asyncio.gather(*waiting)

    async def close(self) -> None:
        """Stop every pending call (the relay is ending); their keys are released."""
        self._closing = True
        tasks = [p.task for p in self._pending.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reply(
        self,
        pending: _Pending,
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
        reply: Callable[[bytes], Awaitable[None]] | None,
        admit_replay: Callable[[], Awaitable[bool]] | None,
    ) -> bytes | None:
        try:
            try:
                line = await self._answer(pending, exchange, admit_replay)
            except asyncio.CancelledError:
                if reply is None or not self._closing:
                    raise  # cancelled by the client before it reached the server: no answer
                line = _server_exited(pending.call.request_id)
            if reply is not None and line is not None:
                await reply(line)
            return line
        finally:
            if pending.task is not None:
                self._tasks.discard(pending.task)

    async def _answer(
        self,
        pending: _Pending,
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
        admit_replay: Callable[[], Awaitable[bool]] | None,
    ) -> bytes | None:
        call = pending.call
        policy = self._sep_policy if call.kind == "sep" else self._policy
        try:
            try:
                claim = await policy.begin(call.key, call.fingerprint, scope=call.scope)
            except ConflictError:
                return error_line(call.request_id, sep3182.conflict_error(call.key))
            except InProgressError:
                return error_line(call.request_id, sep3182.in_progress_error(call.key))
            except InvalidKeyError as exc:  # this store's own key limits are narrower
                return error_line(call.request_id, sep3182.invalid_key_error(call.key, str(exc)))
            except Exception as exc:
                # Fail closed: without the store the relay cannot tell a retry from a first call.
                logger.error("idempotency store failed for %s key %r: %s", call.kind, call.key, exc)
                error = sep3182.store_unavailable_error(call.key, str(exc))
                return error_line(call.request_id, error)
            if isinstance(claim, Replay):
                if admit_replay is not None and not await admit_replay():
                    logger.info("replay of %s key %r refused by the relay", call.kind, call.key)
                    return None
                logger.info("replayed %s key %r (fence %d)", call.kind, call.key, claim.fence)
                return _replay_line(call.request_id, claim.response)
            # From here on a client's cancellation never cancels this task (see cancel()): the
            # execution stays owned, its lease kept alive, while the server works.
            pending.execution = claim
            pending.forwarded = True
            pending.mark_sent()
            return await self._drive(pending, claim, exchange)
        finally:
            pending.mark_sent()
            self._forget(pending)

    def _forget(self, pending: _Pending) -> None:
        if self._pending.get(pending.call.id_key) is pending:
            del self._pending[pending.call.id_key]

    async def _drive(
        self,
        pending: _Pending,
        execution: Execution,
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
    ) -> bytes | None:
        call = pending.call
        try:
            response = await exchange(call.forward)
        except ServerGone:
            if not execution.finished:
                await execution.release()
            return _server_exited(call.request_id)
        except BaseException:
            if not execution.finished:
                await execution.release()
            raise
        if not execution.finished:
            stored = _outcome(response, call.kind)
            if stored is None:
                await execution.release()
            else:
                try:
                    if not await execution.settle(stored):
                        logger.warning("outcome of key %r was not stored", call.key)
                except Exception:
                    # The server answered: its caller gets the answer even though the
                    # store failed; a retry after the lease lapses runs again.
                    logger.warning(
                        "could not record the outcome of key %r", call.key, exc_info=True
                    )
        return response.line

    # -- server to client ----------------------------------------------------------------

    def on_response(self, message: dict[str, Any], line: bytes) -> bytes:
        """The bytes to relay for a server response to a request the relay passed on."""
        method = self._watch.pop(id_key(message.get("id")), None)
        if method is None:
            return line
        result = message.get("result")
        if not isinstance(result, dict):
            return line
        if method == "tools/list":
            self._read_annotations(result)
            return line
        capabilities = result.get("capabilities")
        tools = capabilities.get("tools") if isinstance(capabilities, dict) else None
        # A server without tools has nothing to honour the SEP for; one that declares the
        # capability already keeps its own bytes.
        if not isinstance(tools, dict) or sep3182.CAPABILITY in tools:
            return line
        advertised = sep3182.with_capability(result, {})
        return dumps({**message, "result": advertised}) + b"\n"

    def _read_annotations(self, result: dict[str, Any]) -> None:
        listed = result.get("tools")
        if not isinstance(listed, list):
            return
        for tool in listed:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            annotations = tool.get("annotations")
            hint = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
            self._read_only[tool["name"]] = hint


_BACKGROUND: set[asyncio.Task[None]] = set()
