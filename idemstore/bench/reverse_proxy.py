"""A bare streaming reverse proxy: the floor of ``idemstore gateway``'s added latency.

``python -m idemstore.bench.reverse_proxy --port N --upstream URL`` forwards every request to
``URL``'s origin and streams the answer back, on the gateway's own stack (uvicorn, Starlette,
one pooled httpx client with the gateway's limits), parsing nothing and storing nothing:
what any Python reverse proxy built from these parts costs before it does any work. Only the
hop-by-hop headers and ``Host`` are dropped (RFC 9110 §7.6.1), as the gateway drops them;
``Content-Length`` crosses, so the body is not re-framed as chunks. The ``gateway``
scenario times it beside the gateway and the upstream called directly.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from idemstore.bench.loopback_app import serve_on_loopback

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["main"]

_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]


def _app(upstream: str) -> Any:
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from idemstore.mcp.http_relay import HOP_BY_HOP, response_headers

    dropped = HOP_BY_HOP | {"host"}
    url = httpx.URL(upstream)
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
    client: httpx.AsyncClient | None = None

    async def relay(request: Request) -> Response:
        assert client is not None
        query = request.url.query
        outgoing = client.build_request(
            request.method,
            origin + request.url.path + (f"?{query}" if query else ""),
            # Content-Length kept: the body streams through as one write, not chunked.
            headers=[(k, v) for k, v in request.headers.items() if k not in dropped],
            content=request.stream(),
        )
        answer = await client.send(outgoing, stream=True)
        relayed = StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            background=BackgroundTask(answer.aclose),
        )
        relayed.raw_headers = response_headers(answer)
        return relayed

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal client
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False) as opened:
            client = opened
            yield

    return Starlette(routes=[Route("/{path:path}", relay, methods=_METHODS)], lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    return serve_on_loopback(argv, _app, "--upstream", "e.g. http://127.0.0.1:9000/mcp")


if __name__ == "__main__":
    raise SystemExit(main())
