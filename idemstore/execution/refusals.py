"""What a refusal of the execution path means, whoever answers it: one table for every consumer.

``ExecutionPolicy.begin`` (and ``run``) refuses a keyed call with a typed error. Each consumer
(the ASGI middleware, the MCP server adapters, the MCP proxy and gateway) answers it in its own
wire format, but they must agree on what the refusal *means*, above all whether the client can
fix it by retrying with the same key. ``refusal_of(exc)`` is the only place that knows the error
classes; a consumer keeps a table from ``Refusal`` to its own wire answer::

    try:
        claim = await policy.begin(key, fingerprint, scope=scope)
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise                      # not a refusal: a bug, or a misconfigured store
        return ANSWERS[refusal]        # the consumer's wire answer for that kind

The rule every table follows: a refusal that retrying cannot fix (``not refusal.retryable``)
is never answered as "unavailable, retry later" (HTTP 503, ``Retry-After``), since that advice
could never succeed; a retryable one says when to retry.

``outcome_unknown`` and ``outcome_unrecorded`` are kept apart although neither is retryable:
under ``outcome_unknown`` the work may or may not have run (its holder died without recording
anything; the key was not run again, ``on_takeover="refuse"``), under ``outcome_unrecorded``
it did run, once, but its result could not be recorded (too large for the store, or not
something the code can record). Both stay so for the key's retention, or until the key is
deleted; what a client does differs: find out whether the work happened, or look its result
up elsewhere.
"""

from __future__ import annotations

import enum

from idemstore.errors import (
    ConflictError,
    InProgressError,
    InvalidKeyError,
    LeaseLostError,
    OutcomeTooLargeError,
    OutcomeUnknownError,
    SchemaError,
    StoreUnavailableError,
    UnrecordableResultError,
)

__all__ = ["Refusal", "refusal_of"]


class Refusal(enum.StrEnum):
    """Why the execution path refused a keyed call (nothing ran for this request).

    ``retryable``: whether the same request with the same key can ever succeed later.
    """

    CONFLICT = "conflict"
    """The key was used before with a different request: a new request needs a new key."""

    IN_PROGRESS = "in_progress"
    """Another request with the key is still running: retry shortly to get its outcome."""

    INVALID_KEY = "invalid_key"
    """The key (or the scope) is one the store cannot hold: too long for its limits, a NUL."""

    OUTCOME_UNKNOWN = "outcome_unknown"
    """The key's earlier holder died without recording an outcome and the policy is
    ``on_takeover="refuse"``: the work may or may not have run, and is not run again."""

    OUTCOME_UNRECORDED = "outcome_unrecorded"
    """The key's work ran once, but its result could not be recorded (too large for the
    store, or unrecordable): it is not run again, and there is nothing to replay."""

    LEASE_LOST = "lease_lost"
    """The store granted the key too late to start the work safely; nothing ran."""

    STORE_UNAVAILABLE = "store_unavailable"
    """The store could not be reached or did not answer in time; nothing ran."""

    SCHEMA_MISSING = "schema_missing"
    """The store's schema is missing or out of date: the operator must run
    ``idemstore migrate URL``; no client retry fixes it."""

    @property
    def retryable(self) -> bool:
        """Whether retrying the same request with the same key can ever succeed."""
        return self in _RETRYABLE


_RETRYABLE = frozenset({Refusal.IN_PROGRESS, Refusal.LEASE_LOST, Refusal.STORE_UNAVAILABLE})

# Most specific first: OutcomeTooLargeError is also a ResponseTooLargeError, and
# UnrecordableResultError a TypeError.
_KINDS: tuple[tuple[type[BaseException], Refusal], ...] = (
    (ConflictError, Refusal.CONFLICT),
    (InProgressError, Refusal.IN_PROGRESS),
    (InvalidKeyError, Refusal.INVALID_KEY),
    (OutcomeUnknownError, Refusal.OUTCOME_UNKNOWN),
    (OutcomeTooLargeError, Refusal.OUTCOME_UNRECORDED),
    (UnrecordableResultError, Refusal.OUTCOME_UNRECORDED),
    (LeaseLostError, Refusal.LEASE_LOST),
    (StoreUnavailableError, Refusal.STORE_UNAVAILABLE),
    (SchemaError, Refusal.SCHEMA_MISSING),
)


def refusal_of(exc: BaseException) -> Refusal | None:
    """The refusal ``exc`` (raised by ``ExecutionPolicy.begin`` or ``run``) stands for, or
    ``None`` when it is not one: the work's own error, a cancellation, a store misconfigured
    in some other way (``ConfigurationError``, ``MissingDependencyError``), or a bug. Those
    propagate as they are.
    """
    for cls, refusal in _KINDS:
        if isinstance(exc, cls):
            return refusal
    return None
