"""SEP-3182 (request idempotency for ``tools/call``) on the wire: names, codes, error payloads.

The proxy (``idemstore.mcp.proxy``, ``idemstore.mcp.calls``) and the server adapters
(``idemstore.mcp.server``) speak the same dialect through this module, so a client sees the
same field, the same ``error.data.type`` values and the same JSON-RPC codes whichever consumer
answers it. It depends on nothing but the standard library: the stdio proxy does not need the
MCP SDK installed.

What callers may rely on:

- ``key_of(params)`` is the one reading of ``params.idempotencyKey``: absent and ``null`` both
  mean "no key" (SEP-3182 makes the field optional; dropping a null is in every client's
  power, so treating it as absent is the only reading two implementations can agree on).
- ``error(...)`` builds a JSON-RPC error object ``{"code", "message", "data"}`` whose ``data``
  is ``{"type": ..., "idempotencyKey": ...}`` as the SEP suggests. Codes: the SEP defines none
  of its own (clients match ``data.type``); a key reused with other arguments is an error in
  the params (-32602), a duplicate in flight is a request that cannot be served as sent
  (-32600).
- ``REFUSAL_CODES``: JSON-RPC errors meaning the request was refused before any tool ran; they
  are never recorded, even under a SEP key (nothing happened that a retry could duplicate).
  ``REQUEST_CANCELLED`` (-32800, the SDK's answer to a cancelled call) is never recorded either:
  the tool never finished. ``idemstore.mcp.outcome_policy`` holds the whole rule.
- ``REPLAYED_META_KEY``: the ``result._meta`` member every consumer sets on a replay.
- ``with_capability(result)`` adds ``capabilities.tools.idempotency`` to an ``initialize`` or
  ``server/discover`` result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "CAPABILITY",
    "CONFLICT",
    "CONFLICT_CODE",
    "CONTINUATION_FIELDS",
    "INTERNAL_ERROR",
    "INVALID_KEY",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "IN_PROGRESS",
    "IN_PROGRESS_CODE",
    "KEY_FIELD",
    "METHOD_NOT_FOUND",
    "OUTCOME_UNKNOWN",
    "OUTCOME_UNRECORDED",
    "PARSE_ERROR",
    "REFUSAL_CODES",
    "REPLAYED_META_KEY",
    "REQUEST_CANCELLED",
    "SCHEMA_MISSING",
    "SERVER_EXITED",
    "STORE_UNAVAILABLE",
    "conflict_error",
    "error",
    "in_progress_error",
    "invalid_key_error",
    "is_continuation",
    "key_of",
    "store_unavailable_error",
    "with_capability",
]

KEY_FIELD = "idempotencyKey"
"""The ``tools/call`` params member that carries the key."""

CAPABILITY = "idempotency"
"""The member of ``capabilities.tools`` that declares support."""

REPLAYED_META_KEY = "idemstore/idempotent-replayed"
"""``result._meta`` member (value ``true``) on a replayed result, and only on one.

SEP-3182 names no marker, and ``io.modelcontextprotocol/`` names are the specification's own,
so the name is namespaced by this project; it says what HTTP's ``Idempotent-Replayed: true``
header says.
"""

# error.data.type values.
IN_PROGRESS = "idempotency_key_in_progress"
CONFLICT = "idempotency_key_conflict"
INVALID_KEY = "idempotency_key_invalid"
STORE_UNAVAILABLE = "idempotency_store_unavailable"
# Beyond the SEP's own (idemstore.execution.refusals): never retryable under the same key.
OUTCOME_UNKNOWN = "idempotency_outcome_unknown"
OUTCOME_UNRECORDED = "idempotency_outcome_unrecorded"
SCHEMA_MISSING = "idempotency_schema_missing"
SERVER_EXITED = "mcp_server_exited"

# JSON-RPC 2.0 codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800  # the MCP SDK's answer to a request its client cancelled

CONFLICT_CODE = INVALID_PARAMS
IN_PROGRESS_CODE = INVALID_REQUEST

REFUSAL_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})

# MRTR (SEP-2322) continuation fields: such a request resumes an operation the server said is
# unfinished; SEP-3182 leaves it outside idempotency, so it passes straight through.
CONTINUATION_FIELDS = ("requestState", "inputResponses")


def key_of(params: object) -> object:
    """The raw ``idempotencyKey`` of ``tools/call`` params; ``None`` when absent or null.

    Anything else is returned as sent (a non-string is the caller's to reject as invalid).
    """
    # type() first: a dict is the usual case, and an ABC isinstance check costs more.
    if type(params) is not dict and not isinstance(params, Mapping):
        return None
    return params.get(KEY_FIELD)


def is_continuation(params: object) -> bool:
    """Whether ``params`` is an MRTR continuation (outside SEP-3182)."""
    if type(params) is not dict and not isinstance(params, Mapping):
        return False
    # A loop, not any() over a generator: this runs for every tools/call.
    for name in CONTINUATION_FIELDS:  # noqa: SIM110
        if params.get(name) is not None:
            return True
    return False


def error(code: int, message: str, kind: str | None = None, key: object = None) -> dict[str, Any]:
    """A JSON-RPC error object; ``data`` names ``kind`` and the key when ``kind`` is given."""
    body: dict[str, Any] = {"code": code, "message": message}
    if kind is not None:
        data: dict[str, Any] = {"type": kind}
        if isinstance(key, str) and key:
            data[KEY_FIELD] = key
        body["data"] = data
    return body


def in_progress_error(key: str) -> dict[str, Any]:
    """A duplicate while the original still executes: retry after a short delay."""
    message = f"A request with {KEY_FIELD} {key!r} is already in progress; retry shortly"
    return error(IN_PROGRESS_CODE, message, IN_PROGRESS, key)


def conflict_error(key: str) -> dict[str, Any]:
    """The key was recorded with other arguments: a different call needs a new key."""
    message = (
        f"{KEY_FIELD} {key!r} was already used with different arguments; "
        "use a new key for a different call"
    )
    return error(CONFLICT_CODE, message, CONFLICT, key)


def invalid_key_error(key: object, why: str, field: str = KEY_FIELD) -> dict[str, Any]:
    """A key (or its arguments) the consumer cannot use; nothing ran."""
    return error(INVALID_PARAMS, f"Invalid {field}: {why}", INVALID_KEY, key)


def store_unavailable_error(key: str, detail: str = "") -> dict[str, Any]:
    """The store failed before the tool ran: fail closed, the call was not run."""
    message = "The idempotency store is unavailable; the tool was not run. Retry later."
    if detail:
        message = f"{message} ({detail})"
    return error(INTERNAL_ERROR, message, STORE_UNAVAILABLE, key)


def with_capability(result: Mapping[str, Any], capability: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an ``initialize``/``server/discover`` result declaring ``tools.idempotency``.

    Other members of ``capabilities.tools`` are kept; an existing ``idempotency`` member is
    replaced by ``capability``.
    """
    wire = dict(result)
    capabilities = wire.get("capabilities")
    capabilities = dict(capabilities) if isinstance(capabilities, Mapping) else {}
    tools = capabilities.get("tools")
    capabilities["tools"] = {
        **(tools if isinstance(tools, Mapping) else {}),
        CAPABILITY: dict(capability),
    }
    wire["capabilities"] = capabilities
    return wire
