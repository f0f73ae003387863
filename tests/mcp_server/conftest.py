"""A connected ``mcp`` client per adapter and protocol era, and a way to send a keyed call.

The SDK's client has no ``idempotencyKey`` parameter (nor does its ``CallToolRequestParams``
keep unknown fields), so keyed calls go through ``ClientSession.send_request`` with a request
model that adds the field: the bytes on the wire are what a SEP-3182 client sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, Request
from pydantic import TypeAdapter

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.mcp_server.servers import ADAPTERS, Tools, build
from tests.memory_store import store as store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from mcp.server import Server

    from idemstore.protocol import IdempotencyStore

ERAS = ("legacy", "modern")
_RAW = TypeAdapter(dict[str, Any])
NO_KEY = object()


class KeyedParams(CallToolRequestParams):
    """``tools/call`` params with SEP-3182's ``idempotencyKey`` (any JSON, to send bad ones)."""

    idempotency_key: Any = None


class KeyedCall(Request[KeyedParams, Literal["tools/call"]]):
    method: Literal["tools/call"] = "tools/call"


async def call(
    client: Client,
    name: str,
    arguments: dict[str, Any] | None = None,
    key: object = NO_KEY,
    **extra: Any,
) -> dict[str, Any] | MCPError:
    """Send ``tools/call``; the raw result dict, or the ``MCPError`` the server answered."""
    fields: dict[str, Any] = {"name": name, "arguments": arguments, **extra}
    params = KeyedParams(**fields)
    if key is not NO_KEY:
        params.idempotency_key = key
    try:
        return await client.session.send_request(KeyedCall(params=params), _RAW)
    except MCPError as exc:
        return exc


def unmarked(outcome: dict[str, Any] | MCPError) -> dict[str, Any] | MCPError:
    """A replayed result without the replay marker (and a ``_meta`` it alone filled): what
    the original answered. Errors are never marked and come back as they are."""
    if not isinstance(outcome, dict) or not isinstance(outcome.get("_meta"), dict):
        return outcome
    meta = {k: v for k, v in outcome["_meta"].items() if k != REPLAYED_META_KEY}
    rest = {k: v for k, v in outcome.items() if k != "_meta"}
    return {**rest, "_meta": meta} if meta else rest


def error_of(outcome: dict[str, Any] | MCPError) -> dict[str, Any]:
    assert isinstance(outcome, MCPError), f"expected an error, got {outcome!r}"
    return outcome.error.model_dump(mode="json", exclude_none=True)


@dataclass
class Harness:
    """One server (one adapter) on one store, and a client connected in one era."""

    adapter: str
    era: str
    tools: Tools
    store: IdempotencyStore
    server: Server[Any]
    client: Client

    async def call(
        self, name: str, arguments: dict[str, Any] | None = None, key: object = NO_KEY, **extra: Any
    ) -> dict[str, Any] | MCPError:
        return await call(self.client, name, arguments, key, **extra)


def connect(server: Server[Any], era: str) -> Client:
    return Client(server, mode="legacy" if era == "legacy" else "auto")


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=ERAS)
def era(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_harness(adapter: str, era: str, store: IdempotencyStore) -> Callable[..., Any]:
    """``async with make_harness(**options) as h``: a server with these middleware options."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def make(**options: Any) -> AsyncIterator[Harness]:
        tools = Tools()
        server = build(adapter, tools, store, **options)
        async with connect(server, era) as client:
            yield Harness(adapter, era, tools, store, server, client)

    return make


@pytest.fixture
async def harness(make_harness: Callable[..., Any]) -> AsyncIterator[Harness]:
    # The client's task group must be entered and exited by one task, and pytest-asyncio
    # runs fixture setup and teardown in different ones: a holder task owns the connection.
    ready: asyncio.Future[Harness] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def hold() -> None:
        try:
            async with make_harness() as made:
                ready.set_result(made)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    holder = asyncio.create_task(hold())
    try:
        yield await ready
    finally:
        stop.set()
        await holder
