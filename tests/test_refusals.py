"""``refusal_of``: the one classification of the execution path's errors every consumer uses."""

from __future__ import annotations

import asyncio

import pytest

from idemstore.errors import (
    CanonicalizationError,
    ConfigurationError,
    ConflictError,
    IdemstoreError,
    InProgressError,
    InvalidKeyError,
    LeaseLostError,
    MissingDependencyError,
    OutcomeTooLargeError,
    OutcomeUnknownError,
    ResponseTooLargeError,
    SchemaError,
    StoreUnavailableError,
    UnrecordableResultError,
)
from idemstore.refusals import Refusal, refusal_of

KEYED = {"key": "k", "scope": "", "record": None}


@pytest.mark.parametrize(
    ("error", "refusal"),
    [
        (ConflictError("x", **KEYED), Refusal.CONFLICT),
        (InProgressError("x", **KEYED), Refusal.IN_PROGRESS),
        (InvalidKeyError("key is 9 characters long; the limit is 8"), Refusal.INVALID_KEY),
        (OutcomeUnknownError("x", **KEYED, previous_fence=1), Refusal.OUTCOME_UNKNOWN),
        (
            OutcomeTooLargeError("x", **KEYED, size=2, limit=1, fence=1),
            Refusal.OUTCOME_UNRECORDED,
        ),
        (UnrecordableResultError("x", **KEYED, fence=1), Refusal.OUTCOME_UNRECORDED),
        (LeaseLostError("x", **KEYED), Refusal.LEASE_LOST),
        (StoreUnavailableError("x"), Refusal.STORE_UNAVAILABLE),
        (SchemaError("x"), Refusal.SCHEMA_MISSING),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
def test_each_error_of_the_execution_path_is_one_refusal(
    error: Exception, refusal: Refusal
) -> None:
    assert refusal_of(error) is refusal


@pytest.mark.parametrize(
    "error",
    [
        ConfigurationError("bad option"),
        MissingDependencyError("pip install"),
        CanonicalizationError("NaN", "/x"),
        ResponseTooLargeError("too large"),
        IdemstoreError("a third party's own error"),
        TypeError("a bug"),
        asyncio.CancelledError(),
    ],
    ids=lambda error: type(error).__name__,
)
def test_what_is_not_a_refusal_is_none_and_propagates(error: BaseException) -> None:
    assert refusal_of(error) is None


def test_only_in_progress_lease_lost_and_store_unavailable_are_retryable() -> None:
    retryable = {refusal for refusal in Refusal if refusal.retryable}
    assert retryable == {Refusal.IN_PROGRESS, Refusal.LEASE_LOST, Refusal.STORE_UNAVAILABLE}


def test_refusal_kinds_are_their_names_on_the_wire() -> None:
    assert [str(refusal) for refusal in Refusal] == [
        "conflict",
        "in_progress",
        "invalid_key",
        "outcome_unknown",
        "outcome_unrecorded",
        "lease_lost",
        "store_unavailable",
        "schema_missing",
    ]
