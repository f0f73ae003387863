"""The recorded form of an MCP tool call's outcome, and its rendering per protocol era.

The server adapters (``idemstore.mcp.server``) record what a keyed ``tools/call`` produced as
a ``ToolOutcome`` and replay it from there. A record is era-neutral: it holds no 2026-07-28
vocabulary (``resultType``, the SDK's ``serverInfo`` ``_meta`` stamp), so a result recorded on
a 2025-era connection replays valid on a 2026 one and the other way round; ``render_result``
adds what the asking connection's era needs. A task handle (SEP-2663, ``resultType: "task"``)
exists only at 2026-07-28 and keeps its ``resultType``: it is not a ``CallToolResult``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp_types import SERVER_INFO_META_KEY
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from idemstore.mcp.outcome_policy import TASK_RESULT_TYPE
from idemstore.mcp.sep3182 import REPLAYED_META_KEY

__all__ = [
    "FORMAT_VERSION",
    "RecordUnreadable",
    "ToolOutcome",
    "era_neutral",
    "render_result",
    "replay_marked",
]

FORMAT_VERSION = 1
"""The version of the record format ``ToolOutcome.encode`` writes."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call produced, in a form both adapters can record and replay.

    ``kind`` is ``result`` (``body`` is the wire ``CallToolResult``, ``isError`` ones
    included), ``error`` (``body`` is a JSON-RPC error object) or ``raise`` (``body`` names the
    kind of exception the tool raised and its message). ``original`` is the adapter's own
    object for the execution that produced it; a replay has none and rebuilds from ``body``.
    """

    kind: Literal["result", "error", "raise"]
    body: dict[str, Any]
    record: bool = True
    original: object = field(default=None, compare=False)
    replayed: bool = False

    def encode(self) -> bytes:
        return json.dumps(
            {"v": FORMAT_VERSION, "kind": self.kind, "body": self.body},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> ToolOutcome:
        try:
            loaded = json.loads(data)
            kind, body = loaded["kind"], loaded["body"]
            if loaded.get("v") != FORMAT_VERSION or kind not in ("result", "error", "raise"):
                raise ValueError(f"unknown record format {loaded.get('v')!r}/{kind!r}")
            if not isinstance(body, dict):
                raise ValueError("record body is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise RecordUnreadable(str(exc)) from exc
        return cls(kind, body, replayed=True)


class RecordUnreadable(Exception):
    """Internal: a stored record is not one this module wrote."""


def era_neutral(wire: dict[str, Any]) -> dict[str, Any]:
    """A ``CallToolResult`` as the SDK serialized it, without what belongs to one era.

    The low-level SDK hands a middleware the wire dict of the connection's era: a 2026-era one
    has ``resultType`` and the ``serverInfo`` ``_meta`` stamp. Records must replay on either.
    """
    task = wire.get("resultType") == TASK_RESULT_TYPE  # a handle, not a CallToolResult
    neutral = {k: v for k, v in wire.items() if task or k != "resultType"}
    meta = neutral.get("_meta")
    if isinstance(meta, Mapping) and SERVER_INFO_META_KEY in meta:
        rest = {k: v for k, v in meta.items() if k != SERVER_INFO_META_KEY}
        if rest:
            neutral["_meta"] = rest
        else:
            del neutral["_meta"]
    return neutral


def replay_marked(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a recorded ``CallToolResult`` with ``_meta[REPLAYED_META_KEY] = true``.

    The same marker the proxy and the gateway splice into a replay; never recorded (a record
    is what the tool produced), only added as a replay is delivered.
    """
    wire = dict(body)
    meta = wire.get("_meta")
    wire["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), REPLAYED_META_KEY: True}
    return wire


def render_result(body: dict[str, Any], version: str, stamp: object) -> dict[str, Any]:
    """An era-neutral ``CallToolResult`` as the SDK would send it on a ``version`` connection."""
    wire = dict(body)
    task = wire.get("resultType") == TASK_RESULT_TYPE
    if version in MODERN_PROTOCOL_VERSIONS:
        wire.setdefault("resultType", "complete")
        if stamp is not None:
            meta = wire.get("_meta")
            wire["_meta"] = {
                **(meta if isinstance(meta, Mapping) else {}),
                SERVER_INFO_META_KEY: stamp,
            }
    if task:
        # The stock surface admits CallToolResult | InputRequiredResult only and would strip
        # the handle; the server's tasks extension serializes its own shape after us.
        return wire
    try:
        return serialize_server_result("tools/call", version, wire)
    except (KeyError, ValueError):
        return wire  # a version the SDK's surface does not know: as recorded
