"""The JSON-RPC column of the refusal table: how an MCP consumer answers each ``Refusal``.

Every MCP consumer (the server adapters, the stdio proxy, the HTTP gateway) answers a refusal
of the execution path with the error object ``refusal_error`` builds, so a client sees the
same ``code`` and ``data.type`` whichever consumer answers::

    except Exception as exc:
        refusal = refusal_of(exc)            # idemstore.execution.refusals
        if refusal is None:
            raise
        error = refusal_error(refusal, key, str(exc))

``why`` is shown only where it helps the client and holds no secret: what is wrong with an
invalid key, and (for the proxy, which has always shown it) why the store is unavailable.
A schema problem never shows it (the store's message names its database). Standard library
only, like ``sep3182``: the stdio proxy does not need the MCP SDK.
"""

from __future__ import annotations

from typing import Any

from idemstore.errors import OutcomeTooLargeError
from idemstore.execution.refusals import Refusal
from idemstore.mcp import sep3182

__all__ = ["REFUSAL_ERRORS", "refusal_error"]

# Refusal -> (JSON-RPC code, data.type). -32602: the params are at fault (a new call needs a
# new key); -32600: this call cannot be served under this key (the key's state is at fault);
# -32603: the server is at fault (retry later, or, for a schema, only once it is migrated).
REFUSAL_ERRORS: dict[Refusal, tuple[int, str]] = {
    Refusal.CONFLICT: (sep3182.CONFLICT_CODE, sep3182.CONFLICT),
    Refusal.IN_PROGRESS: (sep3182.IN_PROGRESS_CODE, sep3182.IN_PROGRESS),
    Refusal.INVALID_KEY: (sep3182.INVALID_PARAMS, sep3182.INVALID_KEY),
    Refusal.OUTCOME_UNKNOWN: (sep3182.INVALID_REQUEST, sep3182.OUTCOME_UNKNOWN),
    Refusal.OUTCOME_UNRECORDED: (sep3182.INVALID_REQUEST, sep3182.OUTCOME_UNRECORDED),
    # A lease granted too late is the store failing to answer in time: the same advice.
    Refusal.LEASE_LOST: (sep3182.INTERNAL_ERROR, sep3182.STORE_UNAVAILABLE),
    Refusal.STORE_UNAVAILABLE: (sep3182.INTERNAL_ERROR, sep3182.STORE_UNAVAILABLE),
    Refusal.SCHEMA_MISSING: (sep3182.INTERNAL_ERROR, sep3182.SCHEMA_MISSING),
}

_KEY = sep3182.KEY_FIELD


def refusal_error(
    refusal: Refusal, key: str, why: str = "", cause: BaseException | None = None
) -> dict[str, Any]:
    """The JSON-RPC error object answering ``refusal`` of the call under ``key``.

    ``cause``: the exception refused. An ``OutcomeTooLargeError`` adds its ``size`` and
    ``limit`` (bytes) to ``data``, so every door tells a retry the same facts.
    """
    if refusal is Refusal.CONFLICT:
        return sep3182.conflict_error(key)
    if refusal is Refusal.IN_PROGRESS:
        return sep3182.in_progress_error(key)
    if refusal is Refusal.INVALID_KEY:
        return sep3182.invalid_key_error(key, why or "the store cannot hold this key")
    if refusal is Refusal.STORE_UNAVAILABLE:
        return sep3182.store_unavailable_error(key, why)
    code, kind = REFUSAL_ERRORS[refusal]
    error = sep3182.error(code, _MESSAGES[refusal].format(key=key, field=_KEY), kind, key)
    if isinstance(cause, OutcomeTooLargeError):
        error["data"].update(size=cause.size, limit=cause.limit)
    return error


_MESSAGES = {
    Refusal.OUTCOME_UNKNOWN: (
        "The outcome of the call first made with {field} {key!r} is unknown (it was"
        " interrupted and may or may not have taken effect); it is not run again under this"
        " key. Find out whether it took effect before calling again with a new key"
    ),
    Refusal.OUTCOME_UNRECORDED: (
        "The call first made with {field} {key!r} ran, but its result could not be recorded;"
        " it is not run again under this key"
    ),
    Refusal.LEASE_LOST: (
        "The idempotency store answered too late to run the tool safely; the tool was not"
        " run. Retry later with the same {field}"
    ),
    Refusal.SCHEMA_MISSING: (
        "The server's idempotency store has no up-to-date schema; the tool was not run. Its"
        " operator must run `idemstore migrate URL`; retrying does not help until then"
    ),
}
