"""RFC 9457 problem documents, one per refusal kind: the answer of every door that speaks HTTP
(the HTTP doors in ``idemstore.http``, the Lambda handler's API Gateway events), so it lives in
the core, which every door may import.

``REFUSAL_PROBLEMS`` is the HTTP column of the refusal table (docs/refusals.md): every refusal
the execution path can produce (``idemstore.execution.refusals``) has exactly one answer here,
and the middleware answers every refusal it meets through ``refusal_problem``. ``Retry-After``
is sent exactly when the refusal is retryable, and a refusal no retry can fix is never a 503:
both follow from ``Refusal.retryable`` (a test holds the table to it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, TypeAlias

from idemstore.execution.refusals import Refusal

__all__ = [
    "DEFAULT_DOCS_URL",
    "DOCS_URL_ENV",
    "REFUSAL_PROBLEMS",
    "Problem",
    "RefusalProblem",
    "problem",
    "problem_type",
    "refusal_problem",
]

Problem: TypeAlias = tuple[int, list[tuple[bytes, bytes]], bytes]
"""A response ready to send: status, headers, body."""

# Each refusal's problem type is its section of the docs site's refusals page (RFC 9457: a
# type URI that documents the problem when dereferenced). The site is wherever its reader's
# deployment serves it: IDEMSTORE_DOCS_URL (e.g. https://docs.example.com/idemstore/), read
# per refusal; by default the site's own path, a relative reference that a client resolves
# against the response's URL (docs/refusals.md, "Problem types").
DOCS_URL_ENV = "IDEMSTORE_DOCS_URL"
DEFAULT_DOCS_URL = "/idemstore/docs/"

# Seconds a retryable refusal asks the client to wait.
RETRY_AFTER = 1


@dataclass(frozen=True, slots=True)
class RefusalProblem:
    """How one refusal kind is answered over HTTP."""

    status: int
    title: str
    detail: str


REFUSAL_PROBLEMS: dict[Refusal, RefusalProblem] = {
    Refusal.INVALID_KEY: RefusalProblem(
        400,
        "Invalid Idempotency-Key",
        "This Idempotency-Key cannot be used; send a shorter one of plain characters.",
    ),
    Refusal.CONFLICT: RefusalProblem(
        422,
        "Idempotency-Key reused",
        "This Idempotency-Key was already used for a different request (method, path, query"
        " or body differ); use a new key for a new request.",
    ),
    Refusal.IN_PROGRESS: RefusalProblem(
        409,
        "Request in progress",
        "A request with this Idempotency-Key is still being processed; retry after a short"
        " delay to get its response.",
    ),
    # 409: the key's state, not the request, is what stands in the way; no Retry-After, as
    # no retry with this key will ever get past it.
    Refusal.OUTCOME_UNKNOWN: RefusalProblem(
        409,
        "Outcome unknown",
        "The request first sent with this Idempotency-Key was interrupted and its outcome is"
        " unknown: it may or may not have taken effect. It is not run again under this key;"
        " find out whether it took effect before sending it again with a new key.",
    ),
    Refusal.OUTCOME_UNRECORDED: RefusalProblem(
        409,
        "Outcome not recorded",
        "The request first sent with this Idempotency-Key was processed, but its response"
        " could not be recorded for replay. It is not run again under this key; look its"
        " result up instead.",
    ),
    Refusal.LEASE_LOST: RefusalProblem(
        503,
        "Idempotency store too slow",
        "The request was not processed because the idempotency store answered too late to"
        " start it safely; retry later with the same key.",
    ),
    Refusal.STORE_UNAVAILABLE: RefusalProblem(
        503,
        "Idempotency store unavailable",
        "The request was not processed because its Idempotency-Key could not be checked;"
        " retry later with the same key.",
    ),
    # 500: a server misconfiguration; the detail is for the operator and names no database.
    Refusal.SCHEMA_MISSING: RefusalProblem(
        500,
        "Idempotency store not migrated",
        "The request was not processed: the server's idempotency store has no up-to-date"
        " schema. Its operator must run `idemstore migrate URL` against it; retrying does not"
        " help until then.",
    ),
}


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    key: str | None = None,
    retry_after: int | None = None,
    type_: str = "about:blank",
) -> Problem:
    """An ``application/problem+json`` response (RFC 9457)."""
    document: dict[str, Any] = {"type": type_, "title": title, "status": status, "detail": detail}
    if key is not None:
        document["idempotencyKey"] = key
    body = json.dumps(document).encode("utf-8")
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode("ascii")))
    return status, headers, body


def problem_type(refusal: Refusal) -> str:
    """The ``type`` of ``refusal``'s problem document: its section of the refusals page."""
    docs = os.environ.get(DOCS_URL_ENV) or DEFAULT_DOCS_URL
    return f"{docs.rstrip('/')}/refusals/#{refusal.value}"


def refusal_problem(refusal: Refusal, *, key: str | None, detail: str | None = None) -> Problem:
    """The answer to ``refusal``; ``detail`` replaces the table's where the caller knows
    better (an invalid key: what is wrong with it)."""
    answer = REFUSAL_PROBLEMS[refusal]
    return problem(
        answer.status,
        answer.title,
        detail or answer.detail,
        key=key,
        retry_after=RETRY_AFTER if refusal.retryable else None,
        type_=problem_type(refusal),
    )
