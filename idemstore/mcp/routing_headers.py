"""SEP-2243's routing headers and the 2026-07-28 request envelope, as the doors read them.

A Streamable HTTP request of the 2026-07-28 revision names its method in ``Mcp-Method`` and,
for ``tools/call``, its tool in ``Mcp-Name``, so an intermediary can route it without parsing
the body; it carries no session (SEP-2575, SEP-2567): each request's ``params._meta`` holds
the protocol version and the client's capabilities. The gateway passes a request whose
``Mcp-Method`` names no method it reads without parsing its body; one whose headers disagree
with its body is refused (``HEADER_MISMATCH``), so a ``tools/call`` behind
``Mcp-Method: tools/list`` never skips deduplication.

Only wire names here (no SDK import): the gateway runs without the ``mcp`` extra.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "HEADER_MISMATCH",
    "METHOD_HEADER",
    "MODERN_VERSIONS",
    "NAME_HEADER",
    "VERSION_HEADER",
    "declared_method",
    "disagreement",
    "mismatch_error",
    "verify_request",
]

METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
VERSION_HEADER = "mcp-protocol-version"
PARAM_HEADER_PREFIX = "mcp-param-"
HEADER_MISMATCH = -32020
"""The SDK's (``mcp_types.jsonrpc.HEADER_MISMATCH``) code for headers that contradict the body."""
MODERN_VERSIONS = frozenset({"2026-07-28"})
"""Revisions with per-request envelopes and no session (``ping`` and ``initialize`` gone)."""
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
# Methods whose Mcp-Name mirrors a body field (the SDK's NAME_BEARING_METHODS).
_NAME_FIELDS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_B64_PREFIX, _B64_SUFFIX = "=?base64?", "?="
_VERIFY_ID = "idemstore-verify-replay"


def declared_method(headers: Mapping[str, str]) -> str | None:
    """The method ``Mcp-Method`` names, or ``None`` when the request sent none."""
    return headers.get(METHOD_HEADER)


def _decoded(value: str | None) -> str | None:
    # SEP-2243 sends a value that is not plain visible ASCII as =?base64?...?=.
    if value is None or not (value.startswith(_B64_PREFIX) and value.endswith(_B64_SUFFIX)):
        return value
    import base64
    import binascii

    try:
        raw = base64.b64decode(value[len(_B64_PREFIX) : -len(_B64_SUFFIX)], validate=True)
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def disagreement(headers: Mapping[str, str], message: Mapping[str, Any]) -> str | None:
    """Why the routing headers contradict the body (a message for the error), or ``None``.

    A header the request did not send contradicts nothing: 2025-era clients send none.
    """
    method = message.get("method")
    declared = headers.get(METHOD_HEADER)
    if declared is not None and declared != method:
        return f"Mcp-Method header {declared!r} does not match the request body's method"
    field = _NAME_FIELDS.get(method) if isinstance(method, str) else None
    params = message.get("params")
    named = headers.get(NAME_HEADER)
    if field is not None and named is not None and isinstance(params, Mapping):
        value = params.get(field)
        if value is not None and _decoded(named) != value:
            return f"Mcp-Name header does not match the request body's {field!r} parameter"
    return None


def mismatch_error(request_id: object, why: str) -> bytes:
    """The JSON-RPC error (``HEADER_MISMATCH``) answered with 400, as the SDK's server does."""
    error = {"code": HEADER_MISMATCH, "message": why}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


def verify_request(
    headers: Iterable[tuple[str, str]], message: Mapping[str, Any]
) -> tuple[list[tuple[str, str]], bytes]:
    """The cheapest well-formed request carrying the caller's credentials, in its era.

    A 2025-era caller gets ``ping``. The 2026-07-28 revision has no ``ping`` and no session:
    its caller gets ``server/discover`` with the caller's own envelope (protocol version,
    capabilities, client info) and the routing headers of that method. ``headers`` are the
    caller's (credentials and all), without ``accept`` and ``content-type``.
    """
    kept = [
        (name, value)
        for name, value in headers
        if name.lower() not in (METHOD_HEADER, NAME_HEADER)
        and not name.lower().startswith(PARAM_HEADER_PREFIX)
    ]
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    version = dict(kept).get(VERSION_HEADER) or (
        meta.get(PROTOCOL_VERSION_META) if isinstance(meta, Mapping) else None
    )
    if version not in MODERN_VERSIONS:
        return kept, json.dumps({"jsonrpc": "2.0", "id": _VERIFY_ID, "method": "ping"}).encode()
    envelope: dict[str, Any] = {PROTOCOL_VERSION_META: version, CLIENT_CAPABILITIES_META: {}}
    if isinstance(meta, Mapping):
        for name in (CLIENT_CAPABILITIES_META, CLIENT_INFO_META):
            if name in meta:
                envelope[name] = meta[name]
    body = {
        "jsonrpc": "2.0",
        "id": _VERIFY_ID,
        "method": "server/discover",
        "params": {"_meta": envelope},
    }
    kept.append((METHOD_HEADER, "server/discover"))
    return kept, json.dumps(body, separators=(",", ":")).encode()
