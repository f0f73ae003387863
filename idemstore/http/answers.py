"""What the HTTP doors answer instead of running a keyed request: a replay of its recorded
response, or a problem document (RFC 9457) for a refusal, a missing key, an unknown caller."""

from __future__ import annotations

import logging

from idemstore.errors import OutcomeTooLargeError
from idemstore.execution.refusals import Refusal
from idemstore.http.recording import Captured
from idemstore.problems import REFUSAL_PROBLEMS, Problem, problem, refusal_problem

__all__ = [
    "REPLAYED_HEADER",
    "in_progress",
    "key_required",
    "no_caller",
    "refusal_answer",
    "replay_answer",
]

logger = logging.getLogger("idemstore.http.asgi")

REPLAYED_HEADER = (b"idempotent-replayed", b"true")


def key_required() -> Problem:
    """The answer to a request without the key where one is required (400)."""
    return problem(
        400,
        "Idempotency-Key required",
        "This operation requires an Idempotency-Key header: send a unique value per operation,"
        ' e.g. Idempotency-Key: "<a new UUID>", and the same value when you retry it.',
    )


def no_caller(key: str) -> Problem:
    return problem(
        400,
        "Idempotency-Key needs a caller",
        "Idempotency keys are kept per caller, and nothing in this request says who is calling"
        " (no authenticated user, no credential the server reads); authenticate the request.",
        key=key,
    )


def in_progress(key: str) -> Problem:
    """The answer to a retry while the key's request runs elsewhere (409, ``Retry-After``)."""
    return refusal_problem(Refusal.IN_PROGRESS, key=key)


def refusal_answer(refusal: Refusal, key: str, exc: Exception) -> Problem:
    """The answer to ``refusal`` (from ``exc``), logged where the server is at fault."""
    if refusal in (Refusal.STORE_UNAVAILABLE, Refusal.LEASE_LOST, Refusal.SCHEMA_MISSING):
        logger.error("idempotency store failed before the request ran: %s", exc)
    # What is wrong with a key or scope is safe to tell (no secret is in it).
    detail = f"Idempotency-Key: {exc}." if refusal is Refusal.INVALID_KEY else None
    if isinstance(exc, OutcomeTooLargeError):
        detail = (
            f"{REFUSAL_PROBLEMS[refusal].detail} Its response was {exc.size} bytes; the"
            f" recording limit is {exc.limit} bytes."
        )
    return refusal_problem(refusal, key=key, detail=detail)


def replay_answer(key: str, stored: bytes) -> Problem:
    try:
        recorded = Captured.decode(stored)
    except (ValueError, KeyError, TypeError) as exc:
        logger.error("record for Idempotency-Key %r is unreadable: %s", key, exc)
        return problem(500, "Unreadable record", "The recorded response cannot be read.", key=key)
    return recorded.status, [*recorded.headers, REPLAYED_HEADER], recorded.body
