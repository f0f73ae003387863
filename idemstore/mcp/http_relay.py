"""The HTTP plumbing of the gateway: which headers cross, and how an upstream answer is relayed.

Nothing here knows MCP. A reverse proxy must not forward hop-by-hop headers (RFC 9110 §7.6.1:
``Connection`` and the fields it names, ``Keep-Alive``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``); everything else crosses in both directions
as it came, repeated fields (``Set-Cookie``) included. ``Host`` is the upstream's own, as
behind any reverse proxy (httpx sets it from the upstream URL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    import httpx

__all__ = [
    "HOP_BY_HOP",
    "error_response",
    "request_headers",
    "response_headers",
    "streamed",
]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


def _named_by_connection(items: Iterable[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for name, value in items:
        if name.lower() == "connection":
            named.update(part.strip().lower() for part in value.split(",") if part.strip())
    return named


def request_headers(items: Iterable[tuple[str, str]], *, rewritten: bool) -> list[tuple[str, str]]:
    """The client's headers as the upstream gets them.

    ``rewritten``: the gateway will read (and may change) the answer, so it asks for it
    uncompressed; the body it sends is the one it read, so its length is recomputed.
    """
    items = list(items)
    drop = HOP_BY_HOP | _named_by_connection(items) | {"host", "content-length"}
    if rewritten:
        drop |= {"accept-encoding"}
    headers = [(name, value) for name, value in items if name.lower() not in drop]
    if rewritten:
        headers.append(("accept-encoding", "identity"))
    return headers


def response_headers(
    response: httpx.Response, *, drop: Iterable[str] = ()
) -> list[tuple[bytes, bytes]]:
    """The upstream's headers as the client gets them (raw, for Starlette's ``raw_headers``)."""
    items = response.headers.multi_items()
    skip = HOP_BY_HOP | _named_by_connection(items) | {name.lower() for name in drop}
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in items
        if name.lower() not in skip
    ]


def streamed(response: httpx.Response, body: AsyncIterator[bytes] | None = None) -> Response:
    """Relay ``response`` as it arrives (``body``: its bytes transformed), closing it after.

    When the client goes away, Starlette stops iterating and the upstream response is closed:
    a plain relayed request has nothing to finish on the client's behalf.
    """
    relayed = StreamingResponse(
        body if body is not None else response.aiter_raw(),
        status_code=response.status_code,
        background=BackgroundTask(response.aclose),
    )
    drop = () if body is None else ("content-length", "content-encoding")
    relayed.raw_headers = response_headers(response, drop=drop)
    return relayed


def error_response(status: int, message: str) -> Response:
    """A plain-text answer the gateway gives itself (the upstream could not be reached)."""
    return Response(message + "\n", status_code=status, media_type="text/plain; charset=utf-8")
