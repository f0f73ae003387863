"""A Streamable HTTP reverse proxy that deduplicates ``tools/call`` in front of one MCP server.

Every request is relayed to the upstream as it came (method, path, query, body, headers minus
hop-by-hop), and every answer back as it arrives (status, headers, ``text/event-stream``
bodies streamed event by event, GET streams, DELETE). Two kinds of POST to the MCP endpoint
are read:

- ``tools/call`` goes through the same deduplication core as the stdio proxy
  (``idemstore.mcp.gateway_calls``), with its records scoped to the caller's authorization
  boundary (``GatewayScope``).
- ``initialize`` and ``server/discover`` answers (JSON or SSE) get ``tools.idempotency``.

The gateway holds no state of its own between requests: replicas sharing a store (Redis,
Postgres, DynamoDB) deduplicate together, and a retry may land on any of them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from idemstore.backends.startup import store_ready
from idemstore.callers import (
    CallerSources,
    asgi_headers,
    caller_scope,
    describe_caller_rule,
    scope_of_caller,
)
from idemstore.errors import ConfigurationError, MissingDependencyError

try:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingDependencyError.needing(
        "the MCP gateway", "httpx, starlette and uvicorn", exc, "gateway"
    ) from None

from idemstore.mcp import routing_headers
from idemstore.mcp.caller_tokens import bearer_token
from idemstore.mcp.gateway_calls import ToolCalls
from idemstore.mcp.http_relay import (
    error_response,
    request_headers,
    response_headers,
    streamed,
)
from idemstore.mcp.relay_options import RelayOptions
from idemstore.mcp.sse_stream import SSEReader, render_event
from idemstore.mcp.tool_calls import decoded

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from idemstore.mcp.caller_tokens import CallerVerifier
    from idemstore.protocol import IdempotencyStore

__all__ = ["GatewayConfig", "GatewayScope", "McpGateway", "parse_listen", "serve"]

logger = logging.getLogger("idemstore.mcp.gateway")

_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
# Requests whose answers the gateway reads: the capability, the tools' readOnlyHint.
_READ_ANSWERS = frozenset({"initialize", "server/discover", "tools/list"})
# Load balancers' probes, answered by the gateway itself and never relayed.
_PROBES = frozenset({"/healthz", "/readyz"})
_DEFAULT_MAX_BODY = 16 * 1024 * 1024
# What a replay costs the upstream: one request (routing_headers.verify_request) carrying
# the caller's credentials.
_BOTH_MEDIA = "application/json, text/event-stream"
# Methods whose body the gateway must read; a request whose Mcp-Method (SEP-2243) names none
# of them is relayed without parsing its body.
_PARSED = frozenset({"tools/call", "notifications/cancelled", *_READ_ANSWERS})


Unidentified = Literal["relay", "refuse", "shared"]
"""What the gateway does with a keyed ``tools/call`` whose caller it cannot tell apart."""


@dataclass(frozen=True, slots=True)
class GatewayScope:
    """How a request's caller becomes the scope of its idempotency records
    (``idemstore.callers``: a principal, else named credentials, else nobody).

    ``verifier``: when given, the caller is the principal a verified bearer token names
    (``idemstore.mcp.caller_tokens``), the same across token refreshes. A request whose token
    fails verification (forged, expired, revoked, another audience) has no caller: never a
    hash of its bytes instead, never the shared scope, so it never receives a replay.

    ``sources``, without a verifier: the credentials that name the caller (by default
    ``Authorization`` and ``Proxy-Authorization``); only a SHA-256 of them is kept, and a
    refreshed token is a new caller.

    ``unidentified``: a ``tools/call`` with no caller never shares a record with another
    caller. ``"relay"`` (default) forwards it without deduplication, so the upstream answers
    it as it would without the gateway (its 401, its tool's refusal); ``"refuse"`` answers 400
    without forwarding; ``"shared"`` puts every caller that presents no credential at all in
    one anonymous scope: only for an upstream that authenticates nobody.
    """

    sources: CallerSources = field(default_factory=CallerSources)
    unidentified: Unidentified = "relay"
    verifier: CallerVerifier | None = None

    def __post_init__(self) -> None:
        if self.unidentified not in ("relay", "refuse", "shared"):
            raise ConfigurationError(
                f"unidentified must be 'relay', 'refuse' or 'shared', not {self.unidentified!r}"
            )

    async def of(self, scope: Mapping[str, Any], upstream: str) -> str | None:
        """The record scope of the ASGI request ``scope`` sent to ``upstream``, or ``None``
        when it has no caller (and may not share the anonymous scope).

        Gateways in front of other upstreams never share records, even in one store.
        """
        namespace = _namespace(upstream)
        headers = asgi_headers(scope)
        if self.verifier is not None:
            token = bearer_token(headers)
            if token:
                principal = await self.verifier.principal(token)
                return None if principal is None else scope_of_caller(namespace, principal, None)
            if token is not None:  # a credential that is no bearer token: unverifiable
                return None
            found = None
        else:
            query = scope.get("query_string", b"").decode("latin-1")
            found = scope_of_caller(namespace, None, self.sources, headers, query)
        if found is None and self.unidentified == "shared":
            return caller_scope(namespace, "anonymous")
        return found

    def describe(self) -> str:
        """How callers are told apart, for the startup line."""
        if self.verifier is not None:
            return describe_caller_rule(self.verifier.describe(), None)
        return describe_caller_rule(None, self.sources)


@functools.lru_cache(maxsize=16)
def _namespace(upstream: str) -> str:
    # One upstream per gateway: its hash is made once, not per request.
    return "mcp-gateway/" + hashlib.sha256(upstream.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """What the gateway fronts and how it talks to it.

    Attributes:
        upstream: the upstream MCP endpoint, e.g. ``http://127.0.0.1:9000/mcp``. Requests to
            other paths are relayed to the same origin unread (OAuth metadata, health checks).
        connect_timeout: seconds to open a connection to the upstream.
        read_timeout: seconds to wait for the next bytes of an answer (``None``: forever; GET
            streams and long tool calls stay quiet for a long time).
        max_connections: pooled connections to the upstream.
        max_body_bytes: the largest POST body the gateway reads to decide; larger is refused
            with 413.
    """

    upstream: str
    connect_timeout: float = 10.0
    read_timeout: float | None = None
    max_connections: int = 100
    max_body_bytes: int = _DEFAULT_MAX_BODY

    def endpoint(self) -> tuple[str, str]:
        """The upstream's origin and the MCP endpoint's path."""
        url = httpx.URL(self.upstream)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(
                f"--upstream must be an http(s) URL such as http://127.0.0.1:9000/mcp, "
                f"not {self.upstream!r}"
            )
        origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
        return origin, url.path or "/"


class McpGateway:
    """The gateway as an ASGI app (``gateway.app``), one per process.

    Args:
        store: where ``tools/call`` records live; share it between replicas.
        config: the upstream and how to reach it.
        scope: who the caller is and what happens to a request that names none
            (``GatewayScope``).
        verify_replays: before serving a recorded outcome, send the upstream one ``ping``
            carrying the caller's headers and serve the replay only on a 2xx. This stops a
            revoked credential only where the upstream refuses that ping (it authorizes at
            the transport); an upstream that authorizes inside its tools answers ``ping`` for
            anyone, and needs a verified caller (``GatewayScope.verifier``) instead.
        options: the deduplication policy the stdio proxy takes too (``RelayOptions``), or
            its fields as keyword arguments (``lease_ttl=...``, ``run_id=...``).
    """

    def __init__(
        self,
        store: IdempotencyStore,
        config: GatewayConfig,
        *,
        scope: GatewayScope | None = None,
        verify_replays: bool = True,
        options: RelayOptions | None = None,
        **fields: Any,
    ) -> None:
        self.config = config
        self._origin, self._path = config.endpoint()
        self._scope = scope or GatewayScope()
        self._verify_replays = verify_replays
        self._store = store
        self._client: httpx.AsyncClient | None = None
        if options is None:
            options = RelayOptions(**fields)
        elif fields:
            raise ConfigurationError("give RelayOptions or its fields, not both")
        self._calls = ToolCalls(store, self._send_upstream, options)
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=_METHODS)],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with self.connected():
            yield

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[McpGateway]:
        """Open the pooled upstream client (the app's lifespan does this under uvicorn)."""
        timeout = httpx.Timeout(
            connect=self.config.connect_timeout,
            read=self.config.read_timeout,
            write=self.config.connect_timeout,
            pool=self.config.connect_timeout,
        )
        limits = httpx.Limits(
            max_connections=self.config.max_connections,
            max_keepalive_connections=self.config.max_connections,
        )
        verifier = self._scope.verifier
        async with (
            httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client,
            verifier.connected() if verifier is not None else contextlib.nullcontext(),
        ):
            self._client = client
            try:
                yield self
            finally:
                await self._calls.drain()
                self._client = None

    # -- requests ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        path = _url_path(request.scope)
        if request.method != "POST" or path != self._path:
            if path in _PROBES and request.method in ("GET", "HEAD"):
                return await self._probe(path)
            return await self._relay(request, request.stream())
        try:
            body = await self._read_body(request)
        except ClientDisconnect:
            return Response(status_code=499)
        if body is None:
            return error_response(413, f"request body over {self.config.max_body_bytes} bytes")
        declared = routing_headers.declared_method(request.headers)
        if declared is not None and declared not in _PARSED and not _may_name_parsed(body):
            # SEP-2243: the header names the method. A body that may name a method the gateway
            # reads is parsed anyway, so no tools/call hides behind the header.
            return await self._relay(request, body)
        message = decoded(body)
        if not isinstance(message, dict):
            return await self._relay(request, body)
        why = routing_headers.disagreement(request.headers, message)
        if why is not None:  # the gateway will not guess which of the two the upstream believes
            mismatch = routing_headers.mismatch_error(message.get("id"), why)
            return Response(mismatch, status_code=400, media_type="application/json")
        method = message.get("method")
        if message.get("id") is None:
            if method == "notifications/cancelled":
                await self._cancel(request, message)
            return await self._relay(request, body)
        if method == "tools/call":
            answer = await self._tool_call(request, message, body)
            if isinstance(answer, Response):
                return answer
            body = answer  # nothing to deduplicate: relayed (a SEP key stripped)
        elif method in _READ_ANSWERS:
            return await self._read_answer(request, body, message)
        return await self._relay(request, body)

    async def _tool_call(
        self, request: Request, message: dict[str, Any], body: bytes
    ) -> Response | bytes:
        scope = await self._scope.of(request.scope, self.config.upstream)
        target = self._target(request)
        if scope is None:
            # Nobody to scope a record to: never share one (GatewayScope.unidentified).
            return self._calls.unidentified(
                message, body, request.headers, refuse=self._scope.unidentified == "refuse"
            )

        async def verify() -> Response | None:
            return await self._still_accepted(request, target, message)

        return await self._calls.handle(
            message,
            body,
            path=target,
            headers=request.headers,
            scope=scope,
            session=request.headers.get("mcp-session-id", ""),
            verify=verify if self._verify_replays else None,
            receive=request.receive,
        )

    async def _cancel(self, request: Request, message: dict[str, Any]) -> None:
        params = message.get("params")
        if not isinstance(params, dict) or params.get("requestId") is None:
            return
        scope = await self._scope.of(request.scope, self.config.upstream)
        if scope is not None:
            session = request.headers.get("mcp-session-id", "")
            self._calls.cancel(scope, session, params["requestId"])

    async def _still_accepted(
        self, request: Request, target: str, message: Mapping[str, Any]
    ) -> Response | None:
        """Before a replay: ``None`` when the upstream still accepts the caller's credentials,
        else its refusal (relayed as it came: a revoked token gets the upstream's 401).

        One request with the caller's headers (``ping``; ``server/discover`` with the caller's
        envelope for a sessionless 2026-07-28 caller): a recorded outcome is never served on
        the strength of a credential the upstream no longer honours.
        """
        # The caller's headers (credentials, session, protocol version), as a well-formed probe.
        headers, probe = routing_headers.verify_request(
            (
                (name, value)
                for name, value in request_headers(request.headers.items(), rewritten=True)
                if name.lower() not in ("accept", "content-type")
            ),
            message,
        )
        headers += [("accept", _BOTH_MEDIA), ("content-type", "application/json")]
        try:
            response = await self._send_upstream("POST", target, headers, probe)
        except httpx.HTTPError as exc:
            return _unreachable(exc)
        if not 200 <= response.status_code < 300:
            return streamed(response)
        try:
            await response.aread()  # a small answer; read whole, the connection is reused
        except httpx.HTTPError as exc:
            return _unreachable(exc)
        finally:
            await response.aclose()
        return None

    async def _probe(self, path: str) -> Response:
        """``/healthz``: the process answers. ``/readyz``: the store and the upstream answer
        too (any HTTP status from the upstream's origin counts: it is reachable). Neither
        touches the MCP path nor the upstream's own probes."""
        if path == "/healthz":
            return error_response(200, "ok")
        failures = []
        try:
            await store_ready(self._store)  # reachable, and its schema migrated
        except Exception as exc:
            failures.append(f"store: {type(exc).__name__}")
        try:
            response = await self._send_upstream("GET", "/", [], b"")
            await response.aclose()
        except httpx.HTTPError as exc:
            failures.append(f"upstream: {type(exc).__name__}")
        if failures:
            return error_response(503, "not ready: " + "; ".join(failures))
        return error_response(200, "ready")

    def describe(self, listen: str, store: str) -> str:
        """One line for the operator: where it listens, what it fronts, how it tells callers
        apart (``store``: the store URL with its password already redacted)."""
        if self._verify_replays:
            replays = (
                "replays only after the upstream answers a ping with the caller's headers 2xx"
                " (this stops a revoked credential only if the upstream authorizes at the"
                " transport, not inside its tools)"
            )
        else:
            replays = "replays not checked with the upstream"
        return (
            f"idemstore gateway: listening on http://{listen}{self._path} for"
            f" {self.config.upstream}; store {store}; {self._scope.describe()};"
            f" unidentified {self._scope.unidentified}; {replays}; probes /healthz /readyz"
        )

    async def _read_body(self, request: Request) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _send_upstream(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterator[bytes],
    ) -> httpx.Response:
        """Send one request upstream, answer unread (``stream=True``); httpx errors propagate."""
        client = self._client
        if client is None:
            raise RuntimeError("the gateway is not connected: run it under its lifespan")
        upstream = client.build_request(
            method, self._origin + path, headers=headers, content=content
        )
        return await client.send(upstream, stream=True)

    def _target(self, request: Request) -> str:
        scope = request.scope
        query = scope.get("query_string", b"").decode("latin-1")
        return _url_path(scope) + (f"?{query}" if query else "")

    async def _relay(self, request: Request, content: bytes | AsyncIterator[bytes]) -> Response:
        headers = request_headers(request.headers.items(), rewritten=False)
        try:
            response = await self._send_upstream(
                request.method, self._target(request), headers, content
            )
        except httpx.HTTPError as exc:
            return _unreachable(exc)
        return streamed(response)

    async def _read_answer(
        self, request: Request, body: bytes, message: dict[str, Any]
    ) -> Response:
        """Relay a request whose answer the core reads, JSON or event stream alike."""
        relay = self._calls.reader(message)
        headers = request_headers(request.headers.items(), rewritten=True)
        try:
            response = await self._send_upstream("POST", self._target(request), headers, body)
        except httpx.HTTPError as exc:
            return _unreachable(exc)
        media = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if media == "text/event-stream":
            return streamed(response, _relayed_events(response, relay, self.config))
        if media != "application/json":
            return streamed(response)
        try:
            original = await response.aread()
        except httpx.HTTPError as exc:
            return _unreachable(exc)
        finally:
            await response.aclose()
        answer = decoded(original)
        data = relay(answer, original) if isinstance(answer, dict) else original
        relayed = Response(data, status_code=response.status_code)
        relayed.raw_headers = [
            *response_headers(response, drop=("content-length", "content-encoding")),
            (b"content-length", str(len(data)).encode("ascii")),
        ]
        return relayed


async def _relayed_events(
    response: httpx.Response,
    relay: Callable[[dict[str, Any], bytes], bytes],
    config: GatewayConfig,
) -> AsyncIterator[bytes]:
    reader = SSEReader(config.max_body_bytes)
    async for chunk in response.aiter_bytes():
        for event in reader.feed(chunk):
            message = event.message()
            if not isinstance(message, dict) or event.data is None:
                yield event.raw
                continue
            line = event.data.encode("utf-8")
            relayed = relay(message, line)
            if relayed is line:
                yield event.raw
            else:
                yield render_event(relayed.rstrip(b"\n"), event_id=event.id)
    tail = reader.pending()
    if tail:
        yield tail


def _url_path(scope: Mapping[str, Any]) -> str:
    """``request.url.path`` without building and parsing a whole URL on every request: the
    ASGI path with the characters Starlette escapes in it escaped the same way."""
    path: str = scope["path"]
    return path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")


def _may_name_parsed(body: bytes) -> bool:
    # An escape (tools\/call, \u0074ools/call) could spell a name no substring shows.
    return b"\\" in body or b"tools/call" in body or b"notifications/cancelled" in body


def _unreachable(exc: httpx.HTTPError) -> Response:
    logger.warning("upstream unreachable: %s: %s", type(exc).__name__, exc)
    return error_response(502, f"the MCP upstream could not be reached ({type(exc).__name__})")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigurationError(f"--listen wants HOST:PORT, e.g. 127.0.0.1:8080, not {text!r}")
    return host, int(port)


async def serve(gateway: McpGateway, host: str, port: int, *, log_level: str = "warning") -> None:
    """Serve ``gateway.app`` with uvicorn until SIGINT or SIGTERM.

    On shutdown uvicorn stops accepting, lets open requests finish, and the lifespan then waits
    for calls already forwarded upstream, so their outcomes are recorded.
    """
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - exercised by the packaging test
        raise MissingDependencyError.needing("the MCP gateway", "uvicorn", exc, "gateway") from None
    config = uvicorn.Config(
        gateway.app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    await uvicorn.Server(config).serve()
