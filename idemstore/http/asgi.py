"""HTTP ``Idempotency-Key`` (draft-ietf-httpapi-idempotency-key-header) for any ASGI app.

``IdempotencyMiddleware(app, store=..., **options)`` is pure ASGI: it works under Starlette's
``app.add_middleware(IdempotencyMiddleware, store=store)``, FastAPI, or wrapped around any ASGI
callable. A keyed request runs once per ``(scope, key)``; a retry with the same request gets
the recorded response plus ``Idempotent-Replayed: true``; other outcomes, as the draft says:

- key missing where required: 400; key reused with a different request: 422;
- a request with the same key still in progress: in this process, the retry follows the
  original's response from its first byte as it is produced (``idemstore.http.live``);
  elsewhere, 409 (with ``Retry-After``);
- a response that ran but cannot be recorded (past ``max_response_bytes``, trailers): retries
  get 409 "Outcome not recorded" (``idemstore.http.outcome_rule``);
- a keyed request whose caller nobody can tell (no principal, no credential): 400;

each as ``application/problem+json`` with a ``detail`` that says what to do. Every refusal of
the execution path is answered from one table (``idemstore.problems``, docs/refusals.md).

Who the caller is comes from ``idemstore.http.callers``. A route whose principal is only
known after the app authenticated the request (a FastAPI dependency) takes the reserve over:
the middleware then hands a ``KeyedRequest`` to the app in the scope (``KEYED_REQUEST``) and
records what the app answers as it does for any keyed request (``idemstore.http.fastapi``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from idemstore.backends.startup import warn_if_process_local
from idemstore.callers import DEFAULT_SOURCES, CallerSources, Principal, asgi_headers
from idemstore.errors import ConfigurationError, InvalidKeyError
from idemstore.execution import Execution, ExecutionPolicy, Replay
from idemstore.execution.refusals import Refusal, refusal_of
from idemstore.fingerprint_fields import field_selection
from idemstore.http.answers import (
    REPLAYED_HEADER,
    in_progress,
    key_required,
    no_caller,
    refusal_answer,
    replay_answer,
)
from idemstore.http.callers import CallerFunction, CallerRule, user_principal
from idemstore.http.live import LiveResponse
from idemstore.http.options import (
    HEADER_NAME,
    check_app,
    check_size,
    header_names,
    method_set,
    required_predicate,
    store_of,
)
from idemstore.http.outcome_rule import UnrecordedPolicy, check_unrecorded, settle_response
from idemstore.http.recording import Recorder, send_response
from idemstore.http.request_identity import (
    header_values,
    parse_idempotency_key,
    request_fingerprint,
)
from idemstore.http.startup import checking_startup
from idemstore.problems import Problem, problem, refusal_problem
from idemstore.records import MAX_KEY_LENGTH, check_identity

if TYPE_CHECKING:
    from collections.abc import Iterable

    from idemstore.execution import TakeoverPolicy
    from idemstore.http.wire import ASGIApp, Message, Receive, RoutePredicate, Scope, Send
    from idemstore.protocol import IdempotencyStore

__all__ = [
    "DELEGATED_PRINCIPAL",
    "KEYED_REQUEST",
    "Answered",
    "IdempotencyMiddleware",
    "KeyedRequest",
    "delegated_principal",
    "key_required",
    "parse_idempotency_key",
]

logger = logging.getLogger("idemstore.http.asgi")

HEADER = HEADER_NAME.encode("ascii")

KEYED_REQUEST = "idemstore.keyed_request"
"""Where the app finds the ``KeyedRequest`` of a keyed request in its ASGI scope."""

DELEGATED_PRINCIPAL = "idemstore.principal"
"""Where a door in front of this middleware (WSGI, Django) puts the principal it read."""

# Response extensions that would bypass ``send``'s body messages and so the recorder.
_BYPASS_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")
# How the door reads its own principal, for the start-up log line.
_USER = 'scope["user"].identity'


def delegated_principal(scope: Scope) -> Principal | None:
    """The ``caller`` of a middleware behind another door (``idemstore.http.wsgi``,
    ``idemstore.http.django``): the principal that door read and put in the scope. With it, the
    middleware reads no principal of its own and logs no caller rule (the door did)."""
    principal = scope.get(DELEGATED_PRINCIPAL)
    return principal if isinstance(principal, Principal) else None


class Answered(Exception):
    """Raised inside the app, before its response started, to answer the request with
    ``parts`` (status, headers, body) instead: a replay, a refusal. The middleware sends it;
    with ``live``, it sends that running response instead (``parts`` if it never started)."""

    def __init__(self, parts: Problem, live: LiveResponse | None = None) -> None:
        super().__init__(parts[0])
        self.parts = parts
        self.live = live


class _ClientGone(Exception):
    """Internal: the client disconnected while the request body was being read."""


class KeyedRequest:
    """A keyed request whose reserve the app takes over (``claim``), once it knows the
    principal; the middleware records what the app answers, as for any keyed request."""

    __slots__ = (
        "_middleware",
        "claimed",
        "deferred",
        "execution",
        "fingerprint",
        "key",
        "live",
        "scope",
    )

    def __init__(
        self, middleware: IdempotencyMiddleware, scope: Scope, key: str, print_: str
    ) -> None:
        self._middleware = middleware
        self.scope = scope
        self.key = key
        self.fingerprint = print_
        self.deferred = False
        self.claimed = False
        self.execution: Execution | None = None
        self.live = LiveResponse(middleware.max_response_bytes, print_)

    async def claim(self, principal: Principal | None) -> None:
        """Reserve the key for ``principal`` (``None``: the middleware's own rule decides).

        Returns when the app may run; raises ``Answered`` when it must not (a replay, a
        refusal, no caller), and ``ConfigurationError`` when the middleware already reserved
        (it cannot take over: use ``idemstore.http.fastapi.IdempotencyMiddleware``)."""
        if self.claimed:
            raise ConfigurationError(
                "the idempotency key of this request was claimed twice: let a route depend on"
                " idempotency_key() once (its own, or its router's)"
            )
        if not self.deferred:
            raise ConfigurationError(
                "the idempotency key of this request was already reserved by the middleware,"
                " before the route's dependencies ran: add idemstore.http.fastapi's"
                " IdempotencyMiddleware, which lets the route's dependency reserve it"
            )
        self.claimed = True
        middleware = self._middleware
        caller = await middleware.caller_scope(self.scope, principal)
        if caller is None:
            raise Answered(no_caller(self.key))
        begun = await middleware.begin(self.key, caller, self.fingerprint, self.live)
        if isinstance(begun, LiveResponse):
            raise Answered(in_progress(self.key), begun)
        if not isinstance(begun, Execution):
            raise Answered(begun)
        self.execution = begun


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on unsafe requests of an ASGI app.

    Args:
        app: the ASGI app to wrap.
        store: any ``IdempotencyStore`` (the caller owns it: opens and closes it), or a store
            URL such as ``"sqlite:///idempotency.db"``: then the middleware owns the store,
            which connects on first use and is closed on the ASGI lifespan's shutdown (or by
            ``close()``). Several server processes need a store they all share.
        methods: methods the key applies to (default POST and PATCH); others pass through.
        required: ``True`` to require a key on every request of those methods, a sequence of
            path patterns (``fnmatch``, e.g. ``"/orders/*"``), or a predicate given the ASGI
            scope. A missing key where required is a 400.
        caller: a callable given the ASGI scope (may be async) returning the caller: a
            ``Principal``, a string (realm ``app``) or ``None``. Asked first; ``None`` falls
            through to an authenticated ``scope["user"]`` by its ``identity``, then to
            ``caller_sources``. Return a constant to share keys between all callers on
            purpose (docs/http.md, "Who the caller is").
        caller_sources: the credentials that tell callers apart when no principal does:
            ``header:NAME``, ``cookie:NAME``, ``query:NAME`` (default ``Authorization`` and
            ``Proxy-Authorization``); ``None``: none, a principal is required. A keyed
            request with neither a principal nor one of these is refused with 400.
        retention: seconds a response is replayed (default 24 hours).
        lease_ttl: seconds a request holds its key without a heartbeat; heartbeats extend it
            while the app runs.
        max_body_bytes: largest request body a keyed request may have (413 beyond it).
        max_response_bytes: largest response recorded. Every response is sent as the app
            produces it (an event stream too) and recorded within this size; a bigger one is
            sent whole but not kept, and retries get 409 "Outcome not recorded".
        on_unrecorded: a response that ran but cannot be recorded (past
            ``max_response_bytes``, or with trailers): ``"refuse"`` every retry under its key
            (default; the request is never run twice), or ``"run"``: release the key, so a
            retry runs the request again. The risk of ``"run"``: a request that charged, sent
            or created something does so once per retry.
        record_server_errors: record 5xx responses too. Off by default: a 5xx says the server
            failed, so the key is released and a retry runs the request again.
        max_key_length: longest key accepted (400 beyond it).
        on_takeover: a request whose key was held by a request that died (its lease lapsed)
            without a response: ``"run"`` it again (default), or ``"refuse"`` with 409
            "Outcome unknown", for this and every retry under that key (the earlier request
            may have taken effect: see docs/refusals.md).
        fingerprint_exclude: JSON pointers (RFC 6901, such as ``"/meta/sent_at"``) into a
            JSON request body whose values the fingerprint leaves out, so a retry that
            differs only there replays instead of a 422. A body that is not JSON counts
            whole. The risk: a left-out field that changes what the request does makes two
            different requests share one outcome.
        fingerprint_include: JSON pointers the fingerprint covers instead of the whole JSON
            body (not with ``fingerprint_exclude``).
        fingerprint_headers: header names whose values the fingerprint covers too (by
            default it covers none).

    Every option is checked here: a wrong one raises ``ConfigurationError`` or ``TypeError``.
    """

    __slots__ = (
        "_callers",
        "_delegated",
        "_fields",
        "_headers",
        "_live",
        "_max_key_length",
        "_methods",
        "_owns_store",
        "_policy",
        "_required",
        "app",
        "max_body_bytes",
        "max_response_bytes",
        "on_unrecorded",
        "record_server_errors",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore | str,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool | Iterable[str] | RoutePredicate = False,
        caller: CallerFunction | None = None,
        caller_sources: Iterable[str] | CallerSources | None = DEFAULT_SOURCES,
        retention: float = 86400.0,
        lease_ttl: float = 30.0,
        max_body_bytes: int = 1024 * 1024,
        max_response_bytes: int = 1024 * 1024,
        record_server_errors: bool = False,
        on_unrecorded: UnrecordedPolicy = "refuse",
        max_key_length: int = MAX_KEY_LENGTH,
        on_takeover: TakeoverPolicy = "run",
        fingerprint_exclude: Iterable[str] | None = None,
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_headers: Iterable[str] | None = None,
    ) -> None:
        check_app(app)
        self.app = app
        self._methods = method_set(methods)
        self._required = required_predicate(required)
        self._delegated = caller is delegated_principal
        self._callers = CallerRule(caller, caller_sources, door=None if self._delegated else _USER)
        self.max_body_bytes = check_size("max_body_bytes", max_body_bytes)
        self.max_response_bytes = check_size("max_response_bytes", max_response_bytes)
        if not isinstance(record_server_errors, bool):
            raise TypeError(f"record_server_errors must be True or False: {record_server_errors!r}")
        self.record_server_errors = record_server_errors
        self.on_unrecorded = check_unrecorded(on_unrecorded)
        # The responses being sent under a key in this process, for a retry to follow.
        self._live: dict[tuple[str, str], LiveResponse] = {}
        self._max_key_length = check_size("max_key_length", max_key_length, least=1)
        self._fields = field_selection(fingerprint_include, fingerprint_exclude)
        self._headers = header_names(fingerprint_headers)
        # The store last: every other mistake is reported before a URL's store is built.
        opened, self._owns_store = store_of(store)
        warn_if_process_local(opened, door="HTTP")  # one set of records per worker?
        self._policy = ExecutionPolicy(
            opened,
            lease_ttl=lease_ttl,
            retention=retention,
            in_flight="reject",
            on_takeover=on_takeover,
            consumer="asgi",
        )
        if not self._delegated:
            self._callers.log()

    @property
    def store(self) -> IdempotencyStore:
        """The store the records are kept in."""
        return self._policy.store

    @property
    def caller_rule(self) -> str:
        """How this middleware tells callers apart, in words (what it logs at start-up)."""
        return str(self._callers)

    async def close(self) -> None:
        """Close the store if the middleware opened it from a URL (else it is the caller's)."""
        if self._owns_store:
            await self._policy.store.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the schema, checked at startup (http/startup.py)
            receive, send = checking_startup(self.store, receive, send, door="ASGI")
        if scope["type"] == "lifespan" and self._owns_store:
            await self.app(scope, receive, self._closing_at_shutdown(send))
            return
        if scope["type"] != "http" or scope.get("method", "").upper() not in self._methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, HEADER)
        if values:
            await self._keyed(scope, receive, send, values)
        elif self._required(scope):
            await send_response(send, *key_required())
        else:
            try:
                await self.app(scope, receive, send)
            except Answered as answered:  # a route that requires a key refused (before it ran)
                await send_response(send, *answered.parts)

    def _closing_at_shutdown(self, send: Send) -> Send:
        """``send`` for the lifespan: the owned store is closed once the app has shut down."""

        async def closing(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                try:
                    await self.close()
                except Exception:
                    logger.warning("could not close the idempotency store", exc_info=True)
            await send(message)

        return closing

    def defers(self, scope: Scope) -> bool:
        """Whether the app reserves this request's key itself, once it knows the principal
        (``KeyedRequest.claim``). Never here; ``idemstore.http.fastapi``'s middleware says so for
        routes with its dependency."""
        return False

    async def caller_scope(self, scope: Scope, principal: Principal | None = None) -> str | None:
        """The record scope of a request: ``principal`` when given, else the ``caller``
        option's, else ``scope["user"]``'s, else its named credentials; ``None``: nobody."""
        if principal is None:
            if self._delegated:
                principal = delegated_principal(scope)
            else:
                principal = await self._callers.aprincipal(scope)
                if principal is None:
                    principal = user_principal(scope.get("user"), "user", "identity")
        query = scope.get("query_string", b"").decode("latin-1")
        return self._callers.scope(principal, asgi_headers(scope), query)

    async def _keyed(self, scope: Scope, receive: Receive, send: Send, values: list[bytes]) -> None:
        if len(values) > 1:
            why = "The request carries more than one Idempotency-Key field; send exactly one."
            await send_response(send, *refusal_problem(Refusal.INVALID_KEY, key=None, detail=why))
            return
        try:
            key = parse_idempotency_key(values[0].decode("latin-1"))
            check_identity(key, "", max_key_length=self._max_key_length)
        except (ValueError, InvalidKeyError) as exc:
            why = f"Idempotency-Key: {exc}."
            await send_response(send, *refusal_problem(Refusal.INVALID_KEY, key=None, detail=why))
            return
        deferred = self.defers(scope)
        caller = None if deferred else await self.caller_scope(scope)
        if caller is None and not deferred:
            await send_response(send, *no_caller(key))
            return
        try:
            body, more = await self._read_body(receive)
        except _ClientGone:
            return
        if more:
            await send_response(
                send,
                *problem(
                    413,
                    "Request body too large for an idempotent request",
                    f"Requests with an Idempotency-Key may carry at most {self.max_body_bytes}"
                    " bytes of body.",
                    key=key,
                ),
            )
            return
        print_ = request_fingerprint(scope, body, fields=self._fields, headers=self._headers)
        request = KeyedRequest(self, scope, key, print_)
        request.deferred = deferred
        if caller is not None:
            begun = await self.begin(key, caller, print_, request.live)
            if isinstance(begun, LiveResponse):
                await self._follow(begun, key, send)
                return
            if not isinstance(begun, Execution):
                await send_response(send, *begun)
                return
            request.execution = begun
        await self._execute(request, scope, receive, send, body)

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        """The request body, and whether it went past ``max_body_bytes`` (then stop reading)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left before sending its whole request: nothing runs.
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def begin(
        self, key: str, caller: str, print_: str, live: LiveResponse
    ) -> Execution | Problem | LiveResponse:
        """Reserve ``key`` in ``caller``'s scope: the execution to run (its response kept in
        ``live``), the running response of this process to follow, or the answer to send
        instead (a replay, a refusal)."""
        try:
            claim = await self._policy.begin(key, print_, scope=caller)
        except Exception as exc:
            refusal = refusal_of(exc)
            if refusal is None:
                raise  # not a refusal: the server answers 500, as for any bug
            running = self._live.get((caller, key))
            if refusal is Refusal.IN_PROGRESS and running and running.fingerprint == print_:
                return running
            return refusal_answer(refusal, key, exc)
        if isinstance(claim, Replay):
            return replay_answer(key, claim.response)
        self._live[(caller, key)] = live
        return claim

    def _done(self, execution: Execution, live: LiveResponse) -> None:
        """The response of ``execution`` is over (complete or cut): nobody may follow it now."""
        live.stop()
        ident = (execution.scope, execution.key)
        if self._live.get(ident) is live:
            del self._live[ident]

    async def _follow(self, live: LiveResponse, key: str, send: Send) -> None:
        """Send the running response ``live`` to a retry; 409 if it ended before it started."""
        if not await live.follow(send, REPLAYED_HEADER):
            await send_response(send, *in_progress(key))

    async def _execute(
        self, request: KeyedRequest, scope: Scope, receive: Receive, send: Send, body: bytes
    ) -> None:
        replayed_body = False

        async def replay_receive() -> Message:
            nonlocal replayed_body
            if not replayed_body:
                replayed_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        inner_scope = dict(scope)
        inner_scope[KEYED_REQUEST] = request
        request.scope = inner_scope  # what the app sees (and may add a "user" to) claims
        extensions = scope.get("extensions")
        if extensions:
            inner_scope["extensions"] = {
                k: v for k, v in extensions.items() if k not in _BYPASS_EXTENSIONS
            }

        async def settle(live: LiveResponse) -> None:
            # The response is complete (its last body message is in hand) and not yet sent:
            # record it, or what stands for it, *before* the client can see the end of it, so
            # a retry sent on seeing it finds the outcome. What the app does after this (a
            # background task) is not the request's outcome.
            if request.execution is None:
                return  # the app answered before it reserved (a 401 of its own): not recorded
            await settle_response(
                request.execution,
                live,
                record_server_errors=self.record_server_errors,
                on_unrecorded=self.on_unrecorded,
            )

        recorder = Recorder(send, request.live, settle)
        try:
            await self.app(inner_scope, replay_receive, recorder)
            if not recorder.ended and request.execution is not None:
                # The app returned without finishing its response (a stream cut short, a
                # client gone): not an outcome; the key is released as the execution is left
                # without a settlement.
                logger.warning(
                    "response to %s %s under Idempotency-Key %r was incomplete: not"
                    " recorded, key released",
                    scope.get("method"),
                    scope.get("path"),
                    request.key,
                )
        except BaseException as exc:
            if isinstance(exc, Answered) and request.execution is None:
                # A claim refused (a replay, a refusal) or following a running response,
                # before the app began its response.
                if exc.live is not None:
                    await self._follow(exc.live, request.key, send)
                else:
                    await send_response(send, *exc.parts)
                return
            # Leaving with an exception before the response ended applies the failure policy
            # (release, or hold); after it ended, the exception is the app's own and propagates.
            if request.execution is not None:
                self._done(request.execution, request.live)
                await request.execution.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            if request.execution is not None:
                self._done(request.execution, request.live)
                await request.execution.__aexit__(None, None, None)
