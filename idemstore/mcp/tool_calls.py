"""The transport-neutral core of an MCP relay that deduplicates ``tools/call``.

A relay (the stdio proxy in ``idemstore.mcp.proxy``, a Streamable HTTP gateway) owns its
transport: it reads client messages, writes server messages, and matches responses to
requests. Everything about ``tools/call`` idempotency is here, so every relay behaves alike:

1. ``core.note_request(message)`` for every client request: the core remembers the ids of
   ``initialize``, ``server/discover`` and ``tools/list`` so their responses can be read.
2. ``core.prepare(message, line)`` for a ``tools/call``: a ``Forward`` (relay its bytes: no
   key, an MRTR continuation, malformed params the server answers), an ``Answer`` (answer the
   client with its bytes at once: an invalid key), or a ``ToolCall`` to run.
3. ``core.start(call, exchange)`` runs a ``ToolCall`` through the one execution path
   (``idemstore.execution``) and returns a task whose result is the bytes to send the client
   (``None``: send nothing). ``exchange(forward)`` is the relay's: send ``forward`` (the bytes
   the server gets: the SEP key stripped) and return the server's final response as a
   ``ServerResponse``, or raise ``ServerGone``. With ``reply``, the task sends the answer
   itself. ``core.close()`` ends every pending call when the relay stops (keys released).
   Where ``core.runs_at_once`` (a store that answers inline, nobody observing), a relay may
   ``await core.start_at_once(call, post, exchange, reply)`` instead: the key is reserved and
   the call forwarded (``post``) in the relay's own step, and only the wait for the answer
   is left to a task.
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

The pieces live in their own modules, which the gateway uses directly (it has no
per-connection state): ``idemstore.mcp.relay_options`` (the options), ``tool_call_keys``
(which key a call runs under), ``tool_call_runs`` (running one call through the execution
path). This module is the per-connection part: pending calls by request id, the requests whose
answers are read, and the response rewriting.

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
import functools
import json
import uuid
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError, IdemstoreError
from idemstore.execution import Execution
from idemstore.execution.eager_tasks import start_task
from idemstore.execution.hooks import current_observer
from idemstore.mcp import sep3182
from idemstore.mcp.outcome_policy import KeyKind
from idemstore.mcp.relay_options import RelayOptions
from idemstore.mcp.tool_call_keys import (
    META_KEY_FIELD,
    Answer,
    Forward,
    KeyDeriver,
    ToolCall,
    dumps,
    error_line,
    id_key,
)
from idemstore.mcp.tool_call_runs import (
    HELD,
    CallRunner,
    PendingCall,
    ServerGone,
    ServerResponse,
    server_exited,
)
from idemstore.protocol import answers_inline
from idemstore.records import check_identity

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "META_KEY_FIELD",
    "Answer",
    "Forward",
    "KeyKind",
    "RelayOptions",
    "ServerGone",
    "ServerResponse",
    "ToolCall",
    "ToolCallCore",
    "advertised",
    "decoded",
    "dumps",
    "error_line",
    "id_key",
]


# json's own C scanner, called directly: json.loads adds a pure-Python encoding sniff and
# a regex for trailing whitespace, a third of its cost on a message of a few hundred bytes.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decoded(message: bytes) -> Any:
    """The JSON value of one client or server message; ``None`` when it is not JSON (or nests
    deeper than the decoder goes), which every relay then treats as not its business.

    Reads what ``json.loads`` reads: a message that opens with ``{`` and no NUL after it is
    UTF-8 to ``json.detect_encoding``, and is scanned at once; any other goes through
    ``json.loads``.
    """
    try:
        if message[:1] != b"{" or message[1:2] == b"\x00":
            return json.loads(message)
        text = message.decode("utf-8", "surrogatepass")
        value, end = _scan(text, 0)
    except (ValueError, RecursionError, StopIteration):
        return None
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return None  # more after the value: not one JSON text
    return value


def advertised(message: dict[str, Any], line: bytes) -> bytes:
    """An ``initialize`` / ``server/discover`` answer with ``tools.idempotency`` declared.

    A server without tools has nothing to honour the SEP for; one that declares the capability
    already keeps its own bytes.
    """
    result = message.get("result")
    if not isinstance(result, dict):
        return line
    capabilities = result.get("capabilities")
    tools = capabilities.get("tools") if isinstance(capabilities, dict) else None
    if not isinstance(tools, dict) or sep3182.CAPABILITY in tools:
        return line
    return dumps({**message, "result": sep3182.with_capability(result, {})}) + b"\n"


class ToolCallCore:
    """``tools/call`` idempotency for one relay connection; see the module docstring.

    Args:
        store: any ``IdempotencyStore`` (shared ones let several relays deduplicate together).
        options: a ``RelayOptions``; or give its fields as keyword arguments
            (``lease_ttl=...``, ``run_id=...``): the run id scopes derived keys (default: a
            new UUID, one per relay instance).
        key_scope: scope of explicit keys (SEP-3182 and ``_meta``).
        consumer: the relay's name in telemetry (``idemstore.consumer``).
    """

    __slots__ = (
        "_closing",
        "_key_scope",
        "_keys",
        "_pending",
        "_run_scope",
        "_runner",
        "_tasks",
        "_watch",
        "relays_first",
        "run_id",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        options: RelayOptions | None = None,
        *,
        key_scope: str = "mcp-proxy/keys",
        consumer: str = "mcp_proxy",
        **fields: Any,
    ) -> None:
        if options is None:
            options = RelayOptions(**fields)
        elif fields:
            raise ConfigurationError("give RelayOptions or its fields, not both")
        self.run_id = options.run_id if options.run_id is not None else uuid.uuid4().hex
        self._run_scope = f"mcp-proxy/run/{self.run_id}"
        self._key_scope = key_scope
        try:
            check_identity("k", self._run_scope)
            check_identity("k", key_scope)
        except IdemstoreError as exc:
            raise ConfigurationError(f"bad run id or key scope: {exc}") from None
        self._keys = KeyDeriver(options)
        self._runner = CallRunner(store, options, consumer)
        self.relays_first = answers_inline(store)
        """Whether a relay may send the server's answer to a call before the core records it
        (``ServerResponse(..., relayed=True)``). Only with a store that answers inline: the
        record is then written in the call's next step, which runs before the relay reads
        anything the client sends once it has the answer, so a retry still finds it; and no
        crash can come between the two that would not take the store along. With any other
        store the outcome is recorded first: a retry may come back before a round trip ends.
        """
        self._watch: dict[str, str] = {}
        self._pending: dict[str, PendingCall] = {}
        # Call tasks until their very end (answering included); kept here rather than by a
        # done callback, which would cost every call one more turn of the event loop.
        self._tasks: set[asyncio.Task[bytes | None]] = set()
        self._closing = False

    @property
    def busy(self) -> bool:
        """Whether any response may need the core (else a relay may pass it unparsed)."""
        return bool(self._pending or self._watch)

    @property
    def watching(self) -> bool:
        """Whether a response may be rewritten (``on_response``): a relay that could send the
        server's bytes first (``relays_first``) must read it before relaying it."""
        return bool(self._watch)

    @property
    def tasks(self) -> set[asyncio.Task[bytes | None]]:
        """The tasks of started calls that have not ended yet (a copy)."""
        return set(self._tasks)

    def is_read_only(self, name: str) -> bool:
        """Whether the server's ``tools/list`` said ``readOnlyHint: true`` for tool ``name``."""
        return self._keys.is_read_only(name)

    # -- client to server ----------------------------------------------------------------

    def note_request(self, message: dict[str, Any]) -> None:
        """Remember a request whose response the core reads (capability, annotations)."""
        method = message.get("method")
        if method in ("initialize", "server/discover", "tools/list"):
            request_id = message.get("id")
            if request_id is not None:
                self._watch[id_key(request_id)] = str(method)

    def prepare(self, message: dict[str, Any], line: bytes) -> ToolCall | Answer | Forward:
        """Classify a client ``tools/call``: run it, ``Answer`` it, or ``Forward`` it as is
        (``KeyDeriver.prepare``); a request id still in use by a pending call is answered."""
        verdict = self._keys.prepare(
            message, line, key_scope=self._key_scope, run_scope=self._run_scope
        )
        if isinstance(verdict, ToolCall) and verdict.id_key in self._pending:
            why = f"request id {verdict.request_id!r} is already in use by a pending call"
            error = sep3182.error(sep3182.INVALID_REQUEST, why)
            return Answer(error_line(verdict.request_id, error))
        return verdict

    def start(
        self,
        call: ToolCall,
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
        reply: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> asyncio.Task[bytes | None]:
        """Run ``call``; the task's result is what to send the client (``None``: nothing).

        With ``reply``, the task sends that answer itself (``reply(line)``) and returns it,
        which saves a relay a task per call; a call still pending when ``close()`` runs is then
        answered with a ``mcp_server_exited`` error.
        """
        pending = PendingCall(call)
        self._pending[call.id_key] = pending
        # Eager where Python allows: a call whose store answers inline is then forwarded
        # (or answered) before this returns, without waiting for the next turn of the loop.
        task = start_task(
            self._reply(pending, functools.partial(self._runner.answer, pending, exchange), reply),
            name=f"mcp-relay:call:{call.id_key}",
        )
        if not task.done():
            pending.task = task
            self._tasks.add(task)
        return task

    @property
    def runs_at_once(self) -> bool:
        """Whether ``start_at_once`` may run a call's first step in the relay's own step: the
        store answers inline (``relays_first``) and no observer counts the calls (a key held
        by a call in flight would be tried twice, and counted twice)."""
        return self.relays_first and current_observer() is None

    async def start_at_once(
        self,
        call: ToolCall,
        post: Callable[[bytes], Awaitable[Awaitable[ServerResponse]]],
        exchange: Callable[[bytes], Awaitable[ServerResponse]],
        reply: Callable[[bytes], Awaitable[None]],
    ) -> None:
        """``start`` for a relay where ``runs_at_once``: reserve the key and forward the call
        in the caller's own step, leaving only the wait for the server's answer to a task.

        ``post(forward)`` sends the bytes now and returns the awaitable of the server's final
        response (or raises ``ServerGone``). A replay or a refusal is answered with ``reply``
        before this returns; a key held by a call in flight goes to ``start(call, exchange,
        reply)``, which waits for it in a task. Without this, a call's reserve and forward
        wait for the next turn of the event loop where tasks do not start eagerly (3.11).
        """
        pending = PendingCall(call)
        self._pending[call.id_key] = pending
        try:
            claim = await self._runner.claim_at_once(pending)
            if isinstance(claim, bytes):
                self._forget(pending)
                await reply(claim)
                return
            if claim is HELD:
                self._forget(pending)
                self.start(call, exchange, reply)
                return
            assert isinstance(claim, Execution)
            try:
                answer = await post(call.forward)
            except ServerGone:
                self._forget(pending)
                await reply(await self._runner.gone(call, claim))
                return
        except BaseException:
            # Cancelled (the relay is stopping) or failed before the call reached a task:
            # nothing may keep its key.
            self._forget(pending)
            if pending.execution is not None and not pending.execution.finished:
                await pending.execution.release()
            raise
        finish = functools.partial(self._runner.finish, call, claim, answer)
        task = start_task(self._reply(pending, finish, reply), name=f"mcp-relay:call:{call.id_key}")
        if not task.done():
            pending.task = task
            self._tasks.add(task)

    def cancel(self, request_id: object) -> bool:
        """Apply a client's cancellation; ``True`` when the server must get it too."""
        pending = self._pending.get(id_key(request_id))
        if pending is None:
            return True  # not a call the core holds: the server's business
        task = pending.task
        if pending.forwarded and task is not None:
            self._runner.cancel_forwarded(pending)
            return True
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
        pending: PendingCall,
        run: Callable[[], Awaitable[bytes | None]],
        reply: Callable[[bytes], Awaitable[None]] | None,
    ) -> bytes | None:
        """The call's task: ``run()`` (the runner's answer, or its finish once forwarded),
        then the answer to the client; its bookkeeping whatever happens."""
        try:
            try:
                line = await run()
            except asyncio.CancelledError:
                if reply is None or not self._closing:
                    raise  # cancelled by the client before it reached the server: no answer
                line = server_exited(pending.call.request_id)
            finally:
                self._forget(pending)
            if reply is not None and line is not None:
                await reply(line)
            return line
        finally:
            if pending.task is not None:
                self._tasks.discard(pending.task)

    def _forget(self, pending: PendingCall) -> None:
        if self._pending.get(pending.call.id_key) is pending:
            del self._pending[pending.call.id_key]

    # -- server to client ----------------------------------------------------------------

    def on_response(self, message: dict[str, Any], line: bytes) -> bytes:
        """The bytes to relay for a server response to a request the relay passed on."""
        method = self._watch.pop(id_key(message.get("id")), None)
        if method is None:
            return line
        if method == "tools/list":
            result = message.get("result")
            if isinstance(result, dict):
                self._keys.read_annotations(result)
            return line
        return advertised(message, line)
