"""What a key records in place of an outcome that could not be recorded, and how replays read it.

The work of a key ran, but its result is not in the store: it was too large for the store
(``OutcomeTooLargeError``), it was not something that can be recorded
(``UnrecordableResultError``), or the key was taken over from a holder whose outcome is
unknown under ``on_takeover="refuse"`` (``OutcomeUnknownError``). Releasing the key would let
a retry run the work a second time; so the execution records a small *marker* as the key's
outcome instead, and every replay of it raises the marker's error.

A marker is a completed record's response that starts with ``MARKER_PREFIX``, then the kind,
a NUL and the details (JSON). No schema change is needed, and no real response can be taken
for a marker: a response that itself starts with ``MARKER_PREFIX`` is recorded escaped (the
prefix, ``raw``, a NUL, then the response) and replayed exactly. Only the execution path
(``ExecutionPolicy``) writes and reads markers; ``store.get`` shows the stored bytes as they
are.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from idemstore.errors import OutcomeTooLargeError, OutcomeUnknownError, UnrecordableResultError

if TYPE_CHECKING:
    from idemstore.errors import ResponseTooLargeError
    from idemstore.protocol import IdempotencyStore, Lease, Record

__all__ = [
    "MARKER_PREFIX",
    "escape",
    "outcome_unknown",
    "outcome_unknown_error",
    "record_outcome_unknown",
    "record_too_large",
    "replayed_response",
    "too_large",
    "too_large_error",
    "unrecordable",
    "unrecordable_error",
]

# The execution path's logger: recording a marker is part of an execution's story.
logger = logging.getLogger("idemstore.execution")

MARKER_PREFIX = b"\x00idemstore-marker\x00"
_RAW = b"raw"
_TOO_LARGE = b"too-large"
_UNRECORDABLE = b"unrecordable"
_UNKNOWN = b"outcome-unknown"


def _marker(kind: bytes, details: dict[str, Any]) -> bytes:
    return MARKER_PREFIX + kind + b"\x00" + json.dumps(details).encode()


def escape(response: bytes) -> bytes:
    """What to record for ``response``: itself, unless it starts like a marker."""
    if response.startswith(MARKER_PREFIX):
        return MARKER_PREFIX + _RAW + b"\x00" + response
    return response


def too_large(size: int, limit: int | None, why: str) -> bytes:
    """The marker of a result of ``size`` bytes that the store (or the policy) refused."""
    return _marker(_TOO_LARGE, {"size": size, "limit": limit, "why": why})


def unrecordable(why: str) -> bytes:
    """The marker of a result that cannot be recorded (``why`` says what and why)."""
    return _marker(_UNRECORDABLE, {"why": why})


def outcome_unknown(previous_fence: int) -> bytes:
    """The marker of a takeover refused: the holder of ``previous_fence`` left no outcome."""
    return _marker(_UNKNOWN, {"previous_fence": previous_fence})


def too_large_error(
    key: str,
    scope: str,
    fence: int,
    size: int,
    limit: int | None,
    why: str,
    record: Record | None = None,
) -> OutcomeTooLargeError:
    bound = f"the limit is {limit} bytes" if limit is not None else f"the store said: {why}"
    return OutcomeTooLargeError(
        f"the result of idempotency key {key!r} (fence {fence}) was {size} bytes, too large to"
        f" record ({bound}). The work ran once and is not run again under this key; store"
        " large results elsewhere and return a reference",
        key=key,
        scope=scope,
        record=record,
        size=size,
        limit=limit,
        fence=fence,
    )


def unrecordable_error(
    key: str, scope: str, fence: int, why: str, record: Record | None = None
) -> UnrecordableResultError:
    return UnrecordableResultError(
        f"{why}. The work of idempotency key {key!r} ran once (fence {fence}) and is not run"
        " again under this key",
        key=key,
        scope=scope,
        record=record,
        fence=fence,
    )


def outcome_unknown_error(
    key: str, scope: str, previous_fence: int, record: Record | None = None
) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"the outcome of idempotency key {key!r} is unknown: its holder (fence"
        f" {previous_fence}) lost its lease without recording one, and the policy is"
        " on_takeover='refuse'. The work was not run again; once you know what happened,"
        " delete the key to let it run",
        key=key,
        scope=scope,
        record=record,
        previous_fence=previous_fence,
    )


def replayed_response(record: Record) -> bytes:
    """The response to replay from a completed ``record``; a marker raises its error."""
    response = record.response
    assert response is not None
    if not response.startswith(MARKER_PREFIX):
        return response
    kind, _, body = response[len(MARKER_PREFIX) :].partition(b"\x00")
    if kind == _RAW:
        return body
    details = json.loads(body)
    key, scope, fence = record.key, record.scope, record.fence
    if kind == _TOO_LARGE:
        size, limit, why = details["size"], details["limit"], details["why"]
        raise too_large_error(key, scope, fence, size, limit, why, record)
    if kind == _UNRECORDABLE:
        raise unrecordable_error(key, scope, fence, details["why"], record)
    if kind == _UNKNOWN:
        raise outcome_unknown_error(key, scope, details["previous_fence"], record)
    # A marker from a newer idemstore: its outcome is not this code's to replay.
    raise unrecordable_error(key, scope, fence, f"unknown outcome marker {kind!r}", record)


async def record_too_large(
    store: IdempotencyStore, lease: Lease, size: int, refusal: ResponseTooLargeError
) -> None:
    """Record, in place of a result too large for the store, that it was: a released key
    would let a retry run the work a second time."""
    limit = getattr(refusal, "limit", None)
    logger.warning(
        "result of key %r is %d bytes, too large to record (%s): returned to its caller;"
        " retries get OutcomeTooLargeError",
        lease.key,
        size,
        refusal,
    )
    # The store's words, bounded: the marker itself must fit any store.
    marker = too_large(size, limit, str(refusal)[:300])
    try:
        await store.complete(lease, marker)
    except Exception:
        # The key stays held until its lease lapses: better than released at once.
        logger.warning("could not record that key %r was too large", lease.key, exc_info=True)


async def record_outcome_unknown(store: IdempotencyStore, lease: Lease) -> OutcomeUnknownError:
    """Record, on a lease just taken over, that the previous holder's outcome is unknown;
    return the error to raise. Quiet: a store error is logged (the key stays held until the
    lease lapses; the next caller takes it over and is refused in turn)."""
    # A takeover raises the fence by one (the store contract): the dead holder's is below.
    previous = lease.fence - 1
    try:
        await store.complete(lease, outcome_unknown(previous))
    except Exception:
        logger.warning("could not record the unknown outcome of %r", lease.key, exc_info=True)
    return outcome_unknown_error(lease.key, lease.scope, previous)
