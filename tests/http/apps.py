"""The same small HTTP API as a Starlette app and as a FastAPI app, behind the middleware.

``app.state.calls`` records every execution of a handler, so a test sees how often it ran.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request  # noqa: TC002 (FastAPI resolves it at runtime)
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from idemstore import open_store
from idemstore.http.asgi import IdempotencyMiddleware

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore.protocol import IdempotencyStore

FRAMEWORKS = ("starlette", "fastapi")


def _record(request: Request, name: str) -> int:
    calls: list[str] = request.app.state.calls
    calls.append(name)
    return len(calls)


async def create_order(request: Request) -> Response:
    order = await request.json()
    n = _record(request, "create_order")
    return JSONResponse(
        {"id": n, "order": order, "query": dict(request.query_params)},
        status_code=201,
        headers={"Location": f"/orders/{n}"},
    )


async def update_order(request: Request) -> Response:
    n = _record(request, "update_order")
    return JSONResponse({"updated": request.path_params["order_id"], "execution": n})


async def list_orders(request: Request) -> Response:
    n = _record(request, "list_orders")
    return JSONResponse({"execution": n})


async def upload(request: Request) -> Response:
    body = await request.body()
    n = _record(request, "upload")
    return PlainTextResponse(f"{len(body)} bytes (execution {n})")


async def server_error(request: Request) -> Response:
    n = _record(request, "server_error")
    return JSONResponse({"error": "database down", "execution": n}, status_code=503)


async def declined(request: Request) -> Response:
    n = _record(request, "declined")
    return JSONResponse({"error": "card declined", "execution": n}, status_code=402)


async def crash(request: Request) -> Response:
    _record(request, "crash")
    raise RuntimeError("handler crashed")


async def big(request: Request) -> Response:
    n = _record(request, "big")
    size = int(request.query_params.get("size", "100"))
    return PlainTextResponse(str(n) + "x" * size)


async def stream(request: Request) -> Response:
    n = _record(request, "stream")

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"chunk {i} of execution {n}\n".encode()

    return StreamingResponse(chunks(), media_type="text/plain")


async def events(request: Request) -> Response:
    n = _record(request, "events")

    async def chunks() -> AsyncIterator[bytes]:
        yield f"data: execution {n}\n\n".encode()

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def ticks(request: Request) -> Response:
    """An event stream of ``?events=`` events (ids, names, data), ``?delay=`` seconds apart;
    ``?cut=N``: the handler fails after N events (a stream the server cut)."""
    n = _record(request, "ticks")
    count = int(request.query_params.get("events", "50"))
    delay = float(request.query_params.get("delay", "0"))
    cut = int(request.query_params.get("cut", "-1"))

    async def events() -> AsyncIterator[bytes]:
        for i in range(count):
            if i == cut:
                raise RuntimeError("the stream broke")
            yield f"id: {i}\nevent: tick\ndata: execution {n} tick {i}\n\n".encode()
            if delay:
                await asyncio.sleep(delay)

    return StreamingResponse(events(), media_type="text/event-stream")


async def slow(request: Request) -> Response:
    n = _record(request, "slow")
    state = request.app.state
    state.started.set()
    seconds = float(request.query_params.get("seconds", "0"))
    if seconds:
        await asyncio.sleep(seconds)
    else:
        await state.gate.wait()
    return JSONResponse({"execution": n})


async def charge_with_receipt(request: Request) -> Response:
    """A charge whose receipt is mailed by a background task after the response is sent.

    The receipt waits for ``/receipts`` to open (``?fail=1``: then it raises), so a test can hold
    the background work for as long as it likes (``?fail=now``: it raises at once).
    """
    n = _record(request, "charge")
    state = request.app.state

    async def mail_receipt() -> None:
        if request.query_params.get("fail") != "now":
            await state.receipts.wait()
        if request.query_params.get("fail"):
            state.calls.append("receipt-failed")
            raise RuntimeError("the mail server is down")
        state.calls.append("receipt-sent")

    return JSONResponse({"charge": n}, status_code=201, background=BackgroundTask(mail_receipt))


async def send_receipts(request: Request) -> Response:
    request.app.state.receipts.set()
    return JSONResponse({"open": True})


async def executions(request: Request) -> Response:
    """GET: every handler execution and background step so far, in order."""
    return JSONResponse(request.app.state.calls)


# The POST endpoints by path (POST is what the middleware covers by default); "/orders"
# first: FastAPI declares its own (see ``_fastapi_app``).
POSTS = {
    "/orders": create_order,
    "/required/orders": create_order,
    "/upload": upload,
    "/server-error": server_error,
    "/crash": crash,
    "/declined": declined,
    "/big": big,
    "/stream": stream,
    "/events": events,
    "/ticks": ticks,
    "/slow": slow,
    "/charge": charge_with_receipt,
}
ROUTES = [
    *(Route(path, endpoint, methods=["POST"]) for path, endpoint in POSTS.items()),
    Route("/orders", list_orders, methods=["GET"]),
    Route("/orders/{order_id}", update_order, methods=["PATCH", "PUT"]),
    Route("/receipts", send_receipts, methods=["GET"]),
    Route("/calls", executions, methods=["GET"]),
]


def _fastapi_app() -> FastAPI:
    app = FastAPI()

    # The order routes as FastAPI declares them (body parsed by FastAPI); the rest reuse the
    # Starlette endpoints.
    @app.post("/orders", status_code=201)
    async def fastapi_create_order(order: dict[str, Any], request: Request) -> Response:
        n = _record(request, "create_order")
        return JSONResponse(
            {"id": n, "order": order, "query": dict(request.query_params)},
            status_code=201,
            headers={"Location": f"/orders/{n}"},
        )

    for route in ROUTES[1:]:
        app.add_route(route.path, route.endpoint, methods=sorted(route.methods or ()))
    return app


def create_app(framework: str, store: IdempotencyStore, **options: Any) -> Starlette:
    app = _fastapi_app() if framework == "fastapi" else Starlette(routes=ROUTES)
    app.state.calls = []
    app.state.started = asyncio.Event()
    app.state.gate = asyncio.Event()
    app.state.receipts = asyncio.Event()
    options.setdefault("required", ["/required/*"])
    app.add_middleware(IdempotencyMiddleware, store=store, **options)
    return app


def uvicorn_app() -> Starlette:
    """Factory for ``uvicorn --factory``: the Starlette app over a memory store."""
    return create_app("starlette", open_store("memory://"), max_response_bytes=4096)


def fastapi_uvicorn_app() -> Starlette:
    """Factory for ``uvicorn --factory``: the FastAPI app over a memory store, with the
    middleware's default recording limit (1 MiB)."""
    return create_app("fastapi", open_store("memory://"))
