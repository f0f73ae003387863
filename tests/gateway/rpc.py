"""Raw JSON-RPC over HTTP for the gateway tests, with an independent (naive) SSE reading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

BOTH = "application/json, text/event-stream"
# The caller every test request is from unless it says otherwise: the gateway deduplicates
# only calls whose caller it can tell apart.
CALLER = {"authorization": "Bearer gateway-test"}
PROTOCOL = "2025-11-25"


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes

    @property
    def media(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def messages(self) -> list[dict[str, Any]]:
        """Every JSON-RPC message in the body: the JSON body, or each SSE ``data``."""
        if self.media == "application/json":
            return [json.loads(self.body)]
        found = []
        for block in self.body.decode().replace("\r\n", "\n").split("\n\n"):
            data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
            if data:
                found.append(json.loads("\n".join(data)))
        return found

    def final(self) -> dict[str, Any]:
        (answer,) = [m for m in self.messages() if "result" in m or "error" in m]
        return answer


def call(n: int | str, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, **params},
    }


async def post(
    client: httpx.AsyncClient,
    url: str,
    message: dict[str, Any],
    *,
    session: str | None = None,
    accept: str = BOTH,
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST one message; ``headers`` replace the default caller's credentials (``CALLER``)."""
    sent = {"accept": accept, "content-type": "application/json", "mcp-protocol-version": PROTOCOL}
    sent.update(CALLER if headers is None else headers)
    if session is not None:
        sent["mcp-session-id"] = session
    response = await client.post(url, json=message, headers=sent)
    return Answer(response.status_code, response.headers, response.content)


async def open_session(client: httpx.AsyncClient, url: str, **kwargs: Any) -> Answer:
    """``initialize`` then ``notifications/initialized``; the answer to initialize."""
    init = {
        "jsonrpc": "2.0",
        "id": "init",
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "gateway-test", "version": "1"},
        },
    }
    answer = await post(client, url, init, **kwargs)
    session = answer.headers.get("mcp-session-id")
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await post(client, url, note, session=session, **kwargs)
    return answer


async def open_session_id(client: httpx.AsyncClient, url: str, **kwargs: Any) -> str | None:
    """Open a session as ``open_session`` does; its id, or None from a stateless server."""
    return (await open_session(client, url, **kwargs)).headers.get("mcp-session-id")
