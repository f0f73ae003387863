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
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError, MissingDependencyError

try:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingDependencyError(
        f"the MCP gateway needs httpx, starlette and uvicorn ({exc.name} is missing): "
        "pip install 'idemstore[gateway]'"
    ) from None

from idemstore.mcp.gateway_calls import ToolCalls
from idemstore.mcp.http_relay import (
    error_response,
    request_headers,
    response_headers,
    streamed,
)
from idemstore.mcp.sse_stream import SSEReader, render_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from idemstore.protocol import IdempotencyStore

__all__ = ["GatewayConfig", "GatewayScope", "McpGateway", "parse_listen", "serve"]

logger = logging.getLogger("idemstore.mcp.gateway")

_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
# Requests whose answers the gateway reads: the capability, the tools' readOnlyHint.
_READ_ANSWERS = frozenset({"initialize", "server/discover", "tools/list"})
_DEFAULT_MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class GatewayScope:
    """How a request's authorization boundary becomes the scope of its idempotency records.

    By default the boundary is the ``Authorization`` header: requests with the same credential
    share keys, others never see them. ``header`` names another header instead (a tenant or
    workspace id a front proxy sets). Either way only a SHA-256 of the value is kept: the raw
    token never reaches the store, a log line or a span. Requests without the header share
    one anonymous boundary.
    """

    header: str = "authorization"

    def of(self, headers: Mapping[str, str], upstream: str) -> str:
        """The scope of a request with ``headers`` (case-insensitive) sent to ``upstream``.

        Gateways in front of other upstreams never share records, even in one store.
        """
        value = headers.get(self.header)
        if value is None:
            boundary = "anonymous"
        else:
            boundary = hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]
        server = hashlib.sha256(upstream.encode("utf-8")).hexdigest()[:16]
        return f"mcp-gateway/{server}/{self.header.lower()}/{boundary}"


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


def _json_message(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


class McpGateway:
    """The gateway as an ASGI app (``gateway.app``), one per process.

    Args:
        store: where ``tools/call`` records live; share it between replicas.
        config: the upstream and how to reach it.
        scope: the authorization boundary of records (``GatewayScope``).
        **call_options: deduplication policy, as the stdio proxy takes it (``lease_ttl``,
            ``retention``, ``in_flight``, ``implicit``, ``tools``, ``exclude_tools``,
            ``run_id``).
    """

    def __init__(
        self,
        store: IdempotencyStore,
        config: GatewayConfig,
        *,
        scope: GatewayScope | None = None,
        **call_options: Any,
    ) -> None:
        self.config = config
        self._origin, self._path = config.endpoint()
        self._scope = scope or GatewayScope()
        self._client: httpx.AsyncClient | None = None
        self._calls = ToolCalls(store, self._send_upstream, **call_options)
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
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            self._client = client
            try:
                yield self
            finally:
                await self._calls.drain()
                self._client = None

    # -- requests ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        if request.method != "POST" or request.url.path != self._path:
            return await self._relay(request, request.stream())
        try:
            body = await self._read_body(request)
        except ClientDisconnect:
            return Response(status_code=499)
        if body is None:
            return error_response(413, f"request body over {self.config.max_body_bytes} bytes")
        message = _json_message(body)
        if isinstance(message, dict) and message.get("id") is not None:
            method = message.get("method")
            if method == "tools/call":
                answer = await self._calls.handle(
                    message,
                    body,
                    path=self._target(request),
                    headers=request.headers,
                    scope=self._scope.of(request.headers, self.config.upstream),
                )
                if isinstance(answer, Response):
                    return answer
                body = answer  # no key to run: relayed (a null idempotencyKey stripped)
            elif method in _READ_ANSWERS:
                return await self._read_answer(request, body, message)
        return await self._relay(request, body)

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
        query = request.url.query
        return request.url.path + (f"?{query}" if query else "")

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
        answer = _json_message(original)
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
        raise MissingDependencyError(
            f"the MCP gateway needs uvicorn ({exc.name} is missing): "
            "pip install 'idemstore[gateway]'"
        ) from None
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
