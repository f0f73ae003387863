"""SEP-3182 request idempotency for MCP servers: ``tools/call`` with ``params.idempotencyKey``.

One behaviour, two adapters:

- ``ServerIdempotency(store, **options)``: a ``ServerMiddleware`` for the official ``mcp`` SDK's
  low-level ``Server``; append it to ``server.middleware``.
- ``FastMCPIdempotency(store, **options)``: a FastMCP 4.x ``Middleware``; add it with
  ``mcp.add_middleware(...)``.

Both advertise ``tools.idempotency`` in ``initialize`` and ``server/discover`` results and
answer a keyed ``tools/call`` exactly as the SEP says: run it once and record the outcome
(results and errors alike), replay that outcome to a retry with equivalent arguments, reject a
retry with other arguments (``data.type = "idempotency_key_conflict"``) and reject at once,
without waiting, a retry while the original still runs (``"idempotency_key_in_progress"``).
The rules live in ``_Sep3182``; the adapters only translate between it and their framework.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from idemstore.callers import (
    DEFAULT_SOURCES,
    CallerSources,
    asgi_headers,
    caller_sources_of,
    fit_scope,
    scope_of_caller,
)
from idemstore.errors import (
    CanonicalizationError,
    IdemstoreError,
    InvalidKeyError,
    MissingDependencyError,
)
from idemstore.execution import ExecutionPolicy, TakeoverPolicy, current_execution
from idemstore.execution.refusals import Refusal, refusal_of
from idemstore.forwarded_options import reject_unknown
from idemstore.hashing import fingerprint
from idemstore.mcp import routing_headers, sep3182
from idemstore.mcp.outcome_policy import case_of, decide
from idemstore.mcp.outcomes import RecordUnreadable, ToolOutcome, era_neutral
from idemstore.mcp.refusal_errors import refusal_error
from idemstore.mcp.sep3182 import CONFLICT, IN_PROGRESS, INVALID_KEY, KEY_FIELD
from idemstore.mcp.server_wire import (
    ReplayedToolError,
    deliver_fastmcp,
    deliver_lowlevel,
    dump,
    error_outcome,
    raise_outcome,
    tool_result_wire,
    wire_error,
)
from idemstore.records import MAX_KEY_LENGTH, check_identity

try:
    import mcp_types
    from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError
    from fastmcp.server.dependencies import fastmcp_request_ctx
    from fastmcp.server.dependencies import get_access_token as _fastmcp_access_token
    from fastmcp.server.middleware import Middleware
    from fastmcp.tools.base import InputRequiredToolResult, ToolResult
    from mcp.server.auth.provider import principal_components
    from mcp.server.request_state import authenticated_principal
    from mcp.shared.exceptions import MCPError
    from mcp_types import SERVER_INFO_META_KEY
    from pydantic import BaseModel, ValidationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError.needing(
        "idemstore.mcp.server", "the MCP SDK and FastMCP", exc, "mcp"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from fastmcp.server.auth import AccessToken as _FastMCPAccessToken
    from fastmcp.server.middleware import CallNext as FastMCPCallNext
    from fastmcp.server.middleware import MiddlewareContext
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "CONFLICT",
    "DEFAULT_SCOPE",
    "IN_PROGRESS",
    "INVALID_KEY",
    "KEY_FIELD",
    "FastMCPIdempotency",
    "ReplayedToolError",
    "ServerIdempotency",
    "ServerOptions",
]

logger = logging.getLogger("idemstore.mcp.server")

# Without an authenticated principal or a scope= option, records are scoped to this stable
# value: every replica and every restart of a deployment sharing a store agrees on it, so a
# retry that lands on another process still finds the original. (A per-process default would
# silently defeat a shared store.) Deployments that share one store between unrelated servers,
# or whose callers are distinguished by something other than the SDK's auth, pass scope=.
DEFAULT_SCOPE = "mcp-server/shared"

# FastMCP: a tool calling a tool inside one wire request must not be deduplicated again
# under the wire request's key.
_executing: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "idemstore_mcp_executing", default=None
)


class _NotRecorded(Exception):
    """Internal: the outcome must not be stored (the key is released), only returned."""


@dataclass(frozen=True, slots=True)
class _ToolCall:
    key: str
    name: str
    fingerprint: str


def _request_caller(
    ctx: ServerRequestContext[Any, Any], sources: CallerSources | None
) -> str | None:
    """The scope of an HTTP request (Streamable HTTP) by its named credentials
    (``idemstore.callers``), ``None`` over stdio or without one that names somebody (a bare
    ``Bearer`` is none): then the server has no boundary to keep apart (SEP-3182's "whatever
    authorization boundary already governs access")."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    if not isinstance(scope, Mapping):
        return None
    query = scope.get("query_string", b"").decode("latin-1")
    return scope_of_caller("mcp-server", None, sources, asgi_headers(scope), query)


class _PolicyOptions(TypedDict, total=False):
    """The adapters' options ``ExecutionPolicy`` takes as they are, with its defaults."""

    retention: float
    lease_ttl: float
    on_takeover: TakeoverPolicy


class ServerOptions(_PolicyOptions, total=False):
    """The options both adapters take, declared once (``ServerIdempotency`` documents them;
    the SEP-3182 rules and the execution policy hold their defaults and checks)."""

    scope: str | Callable[[ServerRequestContext[Any, Any]], str | None] | None
    caller_sources: Iterable[str] | CallerSources | None
    advertise_retention: bool
    max_key_length: int
    max_response_bytes: int | None


class _Sep3182:
    """The SEP-3182 rules over any store; the adapters supply execution and delivery."""

    __slots__ = (
        "_max_key_length",
        "_policy",
        "_scope",
        "_sources",
        "capability",
    )

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        scope: str | Callable[[ServerRequestContext[Any, Any]], str | None] | None = None,
        caller_sources: Iterable[str] | CallerSources | None = DEFAULT_SOURCES,
        advertise_retention: bool = False,
        max_key_length: int = MAX_KEY_LENGTH,
        max_response_bytes: int | None = None,
        **policy: Unpack[_PolicyOptions],
    ) -> None:
        # in_flight="reject": the SEP forbids both a second execution and blocking the duplicate.
        # max_response_bytes: an outcome over it is returned and the key keeps the "outcome not
        # recorded" marker, as in every door: retries are refused, never run again.
        self._policy = ExecutionPolicy(
            store,
            in_flight="reject",
            consumer="mcp_server",
            max_response_bytes=max_response_bytes,
            **policy,
        )
        if scope is not None and not isinstance(scope, str) and not callable(scope):
            raise TypeError(f"scope must be a str, a callable or None, not {scope!r}")
        if isinstance(scope, str):
            check_identity("k", scope)
        self._scope = scope
        self._sources = caller_sources_of(caller_sources)
        self._max_key_length = max_key_length
        retention = self._policy.retention
        self.capability: dict[str, Any] = {}
        if advertise_retention:
            self.capability["retentionSeconds"] = (
                int(retention) if retention.is_integer() else retention
            )

    @property
    def retention(self) -> float:
        return self._policy.retention

    # -- capability --------------------------------------------------------------------------

    def advertise(self, result: object) -> object:
        """An ``initialize``/``server/discover`` result with ``tools.idempotency`` added."""
        if not isinstance(result, BaseModel | Mapping):
            return result
        return sep3182.with_capability(dump(result), self.capability)

    # -- requests ----------------------------------------------------------------------------

    def read(
        self, params: Mapping[str, Any] | None, ctx: ServerRequestContext[Any, Any] | None = None
    ) -> _ToolCall | None:
        """The keyed call in ``params`` (of the request ``ctx``), or ``None`` when the SEP does
        not apply to it.

        Raises ``MCPError``: invalid params for a key that is not a non-empty string within
        the key limit, or arguments that are not JSON values; ``HEADER_MISMATCH`` for an HTTP
        request whose ``Mcp-Method``/``Mcp-Name`` contradict its body (SEP-2243: the SDK
        checks only 2026-era requests, and a keyed call must never pass for another).
        """
        if not isinstance(params, Mapping):
            return None
        key = sep3182.key_of(params)  # absent and null alike mean no key
        if key is None or sep3182.is_continuation(params):
            return None
        scope = getattr(getattr(ctx, "request", None), "scope", None)
        if isinstance(scope, Mapping):
            message = {"method": "tools/call", "params": params}
            why = routing_headers.disagreement(dict(asgi_headers(scope)), message)
            if why is not None:
                raise wire_error(sep3182.error(routing_headers.HEADER_MISMATCH, why))
        try:
            check_identity(key, "", max_key_length=self._max_key_length)
        except InvalidKeyError as exc:
            why = f"{exc}; send a non-empty string of at most {self._max_key_length} characters"
            raise wire_error(sep3182.invalid_key_error(key, why)) from None
        name = params.get("name")
        arguments = params.get("arguments")
        # Absent and null arguments both mean "no arguments", as for the tool itself.
        if arguments is None:
            arguments = {}
        try:
            print_ = fingerprint({"name": name, "arguments": arguments})
        except CanonicalizationError as exc:
            why = f"not JSON values: {exc}"
            raise wire_error(sep3182.invalid_key_error(key, why, "tool arguments")) from None
        assert isinstance(key, str)  # check_identity accepted it
        return _ToolCall(key=key, name=str(name), fingerprint=print_)

    def scope_of(self, ctx: ServerRequestContext[Any, Any], principal: str | None) -> str:
        """The authorization boundary records are kept in: the principal, else the ``scope``
        option, else the request's named credentials (``caller_sources``, by
        ``idemstore.callers``' rule), else ``DEFAULT_SCOPE``."""
        if principal is not None:
            return fit_scope(f"principal:{principal}")
        scope = self._scope
        if callable(scope):
            scope = scope(ctx)
        if scope is None:
            return _request_caller(ctx, self._sources) or DEFAULT_SCOPE
        if not isinstance(scope, str):
            raise TypeError(f"the scope callable returned {type(scope).__name__}, not str")
        return fit_scope(scope)

    async def call(
        self,
        call: _ToolCall,
        scope: str,
        execute: Callable[[], Awaitable[ToolOutcome]],
    ) -> ToolOutcome:
        """Run ``execute`` at most once for ``(scope, call.key)`` and return its outcome.

        A duplicate gets the recorded outcome (``replayed=True``). Raises ``MCPError`` for a
        duplicate in flight, a conflicting reuse, or a store that cannot be reached before the
        tool ran.
        """
        fresh: ToolOutcome | None = None

        async def work() -> bytes:
            nonlocal fresh
            fresh = await execute()
            if not fresh.record:
                raise _NotRecorded
            try:
                return fresh.encode()
            except (TypeError, ValueError) as exc:  # the tool ran: a retry must not run it again
                why = f"the outcome of tool {call.name!r} is not recordable: {exc}"
                execution = current_execution()
                assert execution is not None  # work runs inside policy.run
                raise await execution.settle_unrecordable(why) from exc

        try:
            result = await self._policy.run(call.key, call.fingerprint, work, scope=scope)
        except _NotRecorded:
            assert fresh is not None
            return fresh
        except Exception as exc:
            if fresh is not None and isinstance(exc, IdemstoreError):
                # The tool ran; its caller gets what it produced even though the store failed.
                logger.warning(
                    "outcome of tool %r under idempotency key %r could not be recorded: %s",
                    call.name,
                    call.key,
                    exc,
                )
                return fresh
            refusal = refusal_of(exc)
            if refusal is None:
                raise
            if refusal.retryable or refusal is Refusal.SCHEMA_MISSING:
                logger.error("idempotency store failed before tool %r ran: %s", call.name, exc)
            # Only a key's fault is told (the store's own messages may name its database).
            why = str(exc) if refusal is Refusal.INVALID_KEY else ""
            raise wire_error(refusal_error(refusal, call.key, why, exc)) from None
        if not result.replayed:
            assert fresh is not None
            return fresh
        try:
            return ToolOutcome.decode(result.value)
        except RecordUnreadable as exc:
            logger.error("record for idempotency key %r is unreadable: %s", call.key, exc)
            message = f"The record for {KEY_FIELD} {call.key!r} is unreadable"
            raise wire_error(sep3182.error(sep3182.INTERNAL_ERROR, message)) from None


class _Adapter:
    """What both adapters take (the options ``ServerIdempotency`` documents) and advertise."""

    __slots__ = ("_sep",)

    def __init__(self, store: IdempotencyStore, **options: Unpack[ServerOptions]) -> None:
        reject_unknown(options, ServerOptions, f"{type(self).__name__}()")
        self._sep = _Sep3182(store, **options)
        self._adapt()

    @property
    def capability(self) -> dict[str, Any]:
        """The ``tools.idempotency`` object this middleware advertises."""
        return dict(self._sep.capability)

    def _adapt(self) -> None:
        """What the adapter sets up beside the SEP-3182 rules (nothing by default)."""


# -- the low-level SDK adapter -------------------------------------------------------------------


class ServerIdempotency(_Adapter):
    """SEP-3182 for the ``mcp`` SDK's low-level ``Server``: ``server.middleware.append(...)``.

    Args:
        store: any ``IdempotencyStore``. Servers with more than one process (stateless HTTP
            behind a load balancer) need one every process shares (SQLite file, Postgres,
            Redis, DynamoDB), not ``memory://``.
        retention: seconds an outcome is replayed (default 24 hours). State it in your docs.
        lease_ttl: seconds a call holds its key without a heartbeat (default 30; heartbeats
            extend it while the tool runs); after a crash, a retry takes the key over once it
            lapses.
        scope: records are scoped to the authenticated principal (the SDK's auth context)
            when there is one. Otherwise to ``scope``: a string, or a callable given the
            ``ServerRequestContext`` that returns the caller's authorization boundary (or
            ``None`` for the default). Then, on Streamable HTTP, the request's named
            credentials (``caller_sources``); else ``DEFAULT_SCOPE``, the same in every
            replica and restart (see docs/mcp-server.md).
        caller_sources: the credentials of an HTTP request that tell callers apart without
            a principal or ``scope``: ``header:NAME``, ``cookie:NAME``, ``query:NAME``
            (default ``Authorization`` and ``Proxy-Authorization``; ``None``: none). One
            that names nobody (a bare ``Bearer``) counts as absent.
        advertise_retention: add ``retentionSeconds`` to the ``tools.idempotency`` capability
            (default off).
        max_key_length: longest key accepted (longer ones are invalid params; default
            ``MAX_KEY_LENGTH``).
        max_response_bytes: an outcome larger than this (encoded) is returned to its caller
            but not recorded: the key keeps the "outcome not recorded" marker and every retry
            gets ``-32600`` ``idempotency_outcome_unrecorded`` with ``size`` and ``limit`` in
            ``data`` (default ``None``: only the store's own limit).
        on_takeover: a call whose key was held by a call that died (lease lapsed) without an
            outcome: ``"run"`` the tool again (default), or ``"refuse"`` it, and every retry,
            with ``data.type = "idempotency_outcome_unknown"`` (docs/refusals.md).
    """

    __slots__ = ("_stamp",)

    def _adapt(self) -> None:
        # The SDK's serverInfo stamp of 2026-era results, learnt from the discover result or
        # a tool result this server produced (a middleware cannot reach the Server): a replay
        # rendered for a 2026 connection carries it too, once known.
        self._stamp: object = None

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.request_id is None:
            return await call_next(ctx)
        method = ctx.method
        if method in ("initialize", "server/discover"):
            advertised = self._sep.advertise(await call_next(ctx))
            self._learn_stamp(advertised)
            return advertised  # type: ignore[return-value]
        if method != "tools/call":
            return await call_next(ctx)
        call = self._sep.read(ctx.params, ctx)
        if call is None:
            return await call_next(ctx)
        scope = self._sep.scope_of(ctx, authenticated_principal(ctx))

        async def execute() -> ToolOutcome:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                return error_outcome(exc)
            except ValidationError as exc:
                # The SDK's params validation: the request never reached the tool.
                return ToolOutcome("error", {}, record=False, original=exc)
            except Exception as exc:
                return raise_outcome("exception", exc)
            wire = dump(result)
            if decide({"result": wire}, "sep") == "release":  # an MRTR input_required ask
                return ToolOutcome("result", wire, record=False, original=result)
            self._learn_stamp(wire)
            return ToolOutcome("result", era_neutral(wire), original=result)

        outcome = await self._sep.call(call, scope, execute)
        return deliver_lowlevel(outcome, ctx.protocol_version, self._stamp)

    def _learn_stamp(self, wire: object) -> None:
        meta = wire.get("_meta") if isinstance(wire, Mapping) else None
        if isinstance(meta, Mapping) and meta.get(SERVER_INFO_META_KEY) is not None:
            self._stamp = meta[SERVER_INFO_META_KEY]


# -- the FastMCP adapter -------------------------------------------------------------------------


def _fastmcp_principal() -> str | None:
    token: _FastMCPAccessToken | None = _fastmcp_access_token()
    if token is None:
        return None
    return json.dumps(list(principal_components(token)), separators=(",", ":"))


class FastMCPIdempotency(_Adapter, Middleware):
    """SEP-3182 for FastMCP 4.x servers: ``mcp.add_middleware(FastMCPIdempotency(store))``.

    Options are those of ``ServerIdempotency``; a ``scope`` callable is given the SDK's
    ``ServerRequestContext`` of the wire request. Middleware added before this one wraps it
    and runs again on every replay; middleware added after it (and the tool) runs once per
    key, and its effect on the result is what is recorded.
    """

    async def on_initialize(
        self,
        context: MiddlewareContext[mcp_types.InitializeRequest],
        call_next: FastMCPCallNext[mcp_types.InitializeRequest, mcp_types.InitializeResult | None],
    ) -> mcp_types.InitializeResult | None:
        result = await call_next(context)
        # The typed capability models drop unknown members, so the wire dict goes up instead;
        # the SDK serializes a dict as it is.
        return self._sep.advertise(result)  # type: ignore[return-value]

    async def on_discover(
        self,
        context: MiddlewareContext[mcp_types.DiscoverRequest],
        call_next: FastMCPCallNext[
            mcp_types.DiscoverRequest, mcp_types.DiscoverResult | dict[str, Any]
        ],
    ) -> mcp_types.DiscoverResult | dict[str, Any]:
        return self._sep.advertise(await call_next(context))  # type: ignore[return-value]

    async def on_call_tool(
        self,
        context: MiddlewareContext[mcp_types.CallToolRequestParams],
        call_next: FastMCPCallNext[mcp_types.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        request = fastmcp_request_ctx.get()
        # The typed message has no idempotencyKey: read the raw wire params through FastMCP's
        # escape hatch to the SDK request context. Programmatic calls (no wire request), other
        # methods, and tools called by a tool inside an executing keyed call pass through.
        srctx = request._srctx if request is not None else None
        if (
            srctx is None
            or srctx.method != "tools/call"
            or _executing.get() is srctx
            or not isinstance(srctx.params, Mapping)
            or srctx.params.get("name") != context.message.name
        ):
            return await call_next(context)
        call = self._sep.read(srctx.params, srctx)
        if call is None:
            return await call_next(context)
        scope = self._sep.scope_of(srctx, _fastmcp_principal())

        async def execute() -> ToolOutcome:
            token = _executing.set(srctx)
            try:
                result = await call_next(context)
            except (NotFoundError, DisabledError) as exc:
                return raise_outcome("not_found", exc)
            except FastMCPError as exc:
                return raise_outcome("tool_error", exc)
            except MCPError as exc:
                return error_outcome(exc)
            except Exception as exc:
                return raise_outcome("exception", exc)
            finally:
                _executing.reset(token)
            if not isinstance(result, ToolResult):
                # An extension interceptor's own result shape: a task handle (SEP-2663) is
                # recorded as sent, so a retry gets the same task; others are not recorded.
                wire = dump(result)
                record = case_of({"result": wire}) == "task"
                return ToolOutcome("result", wire, record=record, original=result)
            if isinstance(result, InputRequiredToolResult):  # an MRTR ask is not an outcome
                return ToolOutcome("result", {}, record=False, original=result)
            return ToolOutcome("result", tool_result_wire(result), original=result)

        outcome = await self._sep.call(call, scope, execute)
        return deliver_fastmcp(outcome)
