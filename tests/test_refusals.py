"""``refusal_of``: the one classification of the execution path's errors every consumer uses."""

from __future__ import annotations

import asyncio

import pytest

from idemstore import errors
from idemstore.execution.refusals import Refusal, refusal_of

KEYED = {"key": "k", "scope": "", "record": None}


# Each error of the execution path, and the refusal it is.
REFUSALS = [
    (errors.ConflictError("x", **KEYED), Refusal.CONFLICT),
    (errors.InProgressError("x", **KEYED), Refusal.IN_PROGRESS),
    (errors.InvalidKeyError("key is 9 characters long; the limit is 8"), Refusal.INVALID_KEY),
    (errors.OutcomeUnknownError("x", **KEYED, previous_fence=1), Refusal.OUTCOME_UNKNOWN),
    (
        errors.OutcomeTooLargeError("x", **KEYED, size=2, limit=1, fence=1),
        Refusal.OUTCOME_UNRECORDED,
    ),
    (errors.UnrecordableResultError("x", **KEYED, fence=1), Refusal.OUTCOME_UNRECORDED),
    (errors.LeaseLostError("x", **KEYED), Refusal.LEASE_LOST),
    (errors.StoreUnavailableError("x"), Refusal.STORE_UNAVAILABLE),
    (errors.SchemaError("x"), Refusal.SCHEMA_MISSING),
]

# Errors that are no refusal: the caller's mistakes, a third party's errors, bugs, cancellation.
NOT_REFUSALS = [
    errors.ConfigurationError("bad option"),
    errors.MissingDependencyError("pip install"),
    errors.CanonicalizationError("NaN", "/x"),
    errors.ResponseTooLargeError("too large"),
    errors.IdemstoreError("a third party's own error"),
    # An operator command's (forget), never raised on the execution path.
    errors.RecordChangedError("changed", key="k", scope="", record=None),
    TypeError("a bug"),
    asyncio.CancelledError(),
]


def test_every_error_idemstore_exports_is_classified_one_way_or_the_other() -> None:
    classified = {type(error) for error, _ in REFUSALS} | {type(e) for e in NOT_REFUSALS}
    assert {getattr(errors, name) for name in errors.__all__} <= classified


@pytest.mark.parametrize(
    ("error", "refusal"), REFUSALS, ids=[type(error).__name__ for error, _ in REFUSALS]
)
def test_each_error_of_the_execution_path_is_one_refusal(
    error: Exception, refusal: Refusal
) -> None:
    assert refusal_of(error) is refusal


@pytest.mark.parametrize("error", NOT_REFUSALS, ids=lambda error: type(error).__name__)
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
