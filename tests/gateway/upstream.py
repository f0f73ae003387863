"""An upstream FastMCP server over Streamable HTTP, run as a subprocess by the gateway tests.

``python -m tests.gateway.upstream --port N --log FILE [--stateless] [--json]``

Every tool execution appends one line (the tool's name) to ``--log``, so a test counts
executions across processes. Besides the FastMCP tools, an ASGI wrapper plays the upstream
failures a gateway meets: a ``tools/call`` of ``http_500`` executes (logs) and answers 500;
``cut_stream`` executes, sends one progress event and drops the connection before its result;
``silent`` executes, sends one progress event and then never answers, keeping its stream open
until the client goes away (what MCP recommends for a request its client cancelled).

``--tokens FILE`` makes it authenticate every request, as real upstreams do, by a token from
that file (one a line, read anew on every request so a test can revoke one) presented in any
of the ways upstreams accept: ``Authorization: Bearer T``, a ``session=T`` cookie, an
``?api_key=T`` query parameter or an ``X-Api-Key: T`` header; anything else gets 401. The
``whoami`` tool answers with the token its request carried (and logs an execution).

``charge`` is a side effect that authorizes inside the tool, as FastMCP apps commonly do (the
transport, ``ping`` included, answers anyone): with ``--jwks FILE`` it runs (logs ``charge``)
only for a bearer JWT that a key in that file verifies for ``tests.gateway.issuer``'s issuer
and audience, unexpired and not listed in ``--revoked FILE``; otherwise it logs ``refused``
and answers an ``isError`` result ``unauthorized``. Without ``--jwks`` it runs for anyone.

``exact`` executes and answers ``EXACT_RESULT`` (bytes ``json.dumps`` cannot write), as one
event or, with ``{"json": true}``, as a JSON body; ``cancelled`` executes and answers
``-32800 Request cancelled``, as the SDK's 2025-era transport does for a cancelled call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from fastmcp import Context, FastMCP

LOG: Path
JWKS: Path | None = None
REVOKED: Path | None = None

EXACT_RESULT = (
    b'{ "content":[{"type":"text","text":"caf\\u00e9"}],'
    b'"structuredContent":{"big":1e400,"one":1.0,"zero":-0.0},"isError":false }'
)


def executed(name: str) -> None:
    with LOG.open("a") as log:
        log.write(f"{name}\n")


def build() -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("gateway-upstream")

    @mcp.tool
    async def record(n: int = 0, note: str = "") -> str:
        """Append to the execution log."""
        executed("record")
        return f"recorded {n} {note}".strip()

    @mcp.tool
    async def slow(n: int = 0, seconds: float = 1.0) -> str:
        """Log, then sleep, then answer."""
        executed("slow")
        await asyncio.sleep(seconds)
        return f"slow {n} done"

    @mcp.tool
    async def progress(n: int = 0, seconds: float = 0.0, ctx: Context | None = None) -> str:
        """Report progress twice before answering (several events on one stream), ``seconds``
        apart."""
        executed("progress")
        if ctx is not None:
            await ctx.report_progress(1, 2)
            await asyncio.sleep(seconds)
            await ctx.report_progress(2, 2)
        return f"progress {n} done"

    @mcp.tool(annotations={"readOnlyHint": True})
    async def look(n: int = 0) -> str:
        """A read-only tool."""
        executed("look")
        return f"looked {n}"

    @mcp.tool
    async def whoami(n: int = 0) -> str:
        """The token this call was authenticated with (an execution)."""
        from fastmcp.server.dependencies import get_http_request

        executed("whoami")
        return f"{n}: {presented_token(get_http_request().scope)}"

    @mcp.tool
    async def charge(amount: int = 0) -> str:
        """Charge the caller (an execution), authorizing the token in the tool itself."""
        from fastmcp.exceptions import ToolError
        from fastmcp.server.dependencies import get_http_request

        caller = authorized(presented_token(get_http_request().scope))
        if caller is None:
            executed("refused")
            raise ToolError("unauthorized")
        executed("charge")
        return f"charged {amount} to {caller}"

    @mcp.tool
    async def headers() -> dict[str, str]:
        """The request headers this call reached the upstream with (not an execution)."""
        from fastmcp.server.dependencies import get_http_headers

        return get_http_headers(include_all=True)

    return mcp


def _tools_call(body: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") == "tools/call":
        params = message.get("params")
        if isinstance(params, dict) and isinstance(params.get("name"), str):
            return message
    return None


def presented_token(scope: Any) -> str | None:
    """The token a request presents, in whichever way it does."""
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    parts = headers.get("authorization", "").split()
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1]
    if headers.get("x-api-key"):
        return headers["x-api-key"]
    cookie = SimpleCookie(headers.get("cookie", ""))
    if "session" in cookie:
        return cookie["session"].value
    query = parse_qs(scope.get("query_string", b"").decode())
    if query.get("api_key"):
        return query["api_key"][0]
    return None


def authorized(token: str | None) -> str | None:
    """Who ``token`` proves to be, checked the way a tool checks it; ``anonymous`` without
    ``--jwks``; ``None`` when refused."""
    if JWKS is None:
        return "anonymous"
    if token is None or (REVOKED is not None and token in REVOKED.read_text().split()):
        return None
    import jwt

    from tests.gateway.issuer import AUDIENCE, ISSUER

    keys = jwt.PyJWKSet.from_json(JWKS.read_text())
    try:
        kid = jwt.get_unverified_header(token).get("kid")
        key = next(k for k in keys.keys if k.key_id == kid)
        claims = jwt.decode(
            token, key, algorithms=["RS256", "ES256"], audience=AUDIENCE, issuer=ISSUER
        )
    except (jwt.PyJWTError, StopIteration):
        return None
    return str(claims["sub"])


class Authenticated:
    """ASGI wrapper: 401 unless the request presents a token listed in the tokens file."""

    def __init__(self, app: Any, tokens: Path) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            valid = set(self.tokens.read_text().split())
            if presented_token(scope) not in valid:
                headers = [(b"www-authenticate", b"Bearer"), (b"content-type", b"text/plain")]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await self.app(scope, receive, send)


async def _answer_raw(send: Any, message: dict[str, Any]) -> None:
    """``exact`` and ``cancelled``: the final response written byte by byte, not by FastMCP."""
    name = message["params"]["name"]
    executed(name)
    request_id = json.dumps(message["id"]).encode()
    if name == "exact":
        data = b'{"result": ' + EXACT_RESULT + b', "jsonrpc":"2.0","id":' + request_id + b"}"
    else:
        error = b'{"code":-32800,"message":"Request cancelled"}'
        data = b'{"jsonrpc":"2.0","id":' + request_id + b',"error":' + error + b"}"
    arguments = message["params"].get("arguments") or {}
    if arguments.get("json"):
        headers = [(b"content-type", b"application/json")]
    else:
        headers = [(b"content-type", b"text/event-stream")]
        data = b"event: message\ndata: " + data + b"\n\n"
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Failures:
    """ASGI wrapper: the failing and byte-exact tools, answered before FastMCP sees them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        tools_call = _tools_call(body)
        name = tools_call["params"]["name"] if tools_call is not None else None
        if tools_call is not None and name in ("exact", "cancelled"):
            await _answer_raw(send, tools_call)
            return
        if name == "http_500":
            executed(name)
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"upstream exploded"})
            return
        if name == "cut_stream":
            executed(name)
            await _start_progress_stream(send)
            raise RuntimeError("cut the stream")  # uvicorn drops the connection
        if name == "silent":
            executed(name)
            await _start_progress_stream(send)
            while (await receive())["type"] != "http.disconnect":
                pass
            return

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                message: dict[str, Any] = await receive()
                return message
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _start_progress_stream(send: Any) -> None:
    """Open an SSE answer with one progress event and no result yet (the stream stays open)."""
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    event = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
    data = b"event: message\ndata: " + json.dumps(event).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


def main() -> None:
    global LOG, JWKS, REVOKED
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--json", action="store_true", help="JSON answers instead of SSE")
    parser.add_argument("--tokens", type=Path, help="authenticate requests by these tokens")
    parser.add_argument("--jwks", type=Path, help="charge authorizes by these keys")
    parser.add_argument("--revoked", type=Path, help="tokens charge refuses")
    args = parser.parse_args()
    LOG = args.log
    JWKS = args.jwks
    REVOKED = args.revoked
    app: Any = Failures(
        build().http_app(path="/mcp", stateless_http=args.stateless, json_response=args.json)
    )
    if args.tokens is not None:
        app = Authenticated(app, args.tokens)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on"
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
