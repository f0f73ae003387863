"""idemstore: make retried operations safe by recording each under an idempotency key."""

from __future__ import annotations

from idemstore.backends.forgetting import forget
from idemstore.backends.registry import Engine, FixtureVariant
from idemstore.backends.sweeper import Sweeper
from idemstore.backends.urls import open_store, register_backend
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
    RecordChangedError,
    ResponseTooLargeError,
    SchemaError,
    StoreUnavailableError,
    UnrecordableResultError,
)
from idemstore.execution import Execution, ExecutionPolicy, LeaseKeeper, Replay, current_execution
from idemstore.hashing import canonical_json, fingerprint
from idemstore.protocol import (
    Checkpoint,
    CheckpointingStore,
    IdempotencyStore,
    Lease,
    ListingStore,
    Outcome,
    Record,
    Reservation,
    Status,
)
from idemstore.records import RecordState
from idemstore.runner import Idempotency, Result
from idemstore.serializers import JSONSerializer, Serializer
from idemstore.telemetry import instrument, uninstrument

__version__ = "0.1.0"

__all__ = [
    "CanonicalizationError",
    "Checkpoint",
    "CheckpointingStore",
    "ConfigurationError",
    "ConflictError",
    "Engine",
    "Execution",
    "ExecutionPolicy",
    "FixtureVariant",
    "IdempotencyStore",
    "Idempotency",
    "IdemstoreError",
    "InProgressError",
    "RecordChangedError",
    "InvalidKeyError",
    "JSONSerializer",
    "Lease",
    "LeaseKeeper",
    "LeaseLostError",
    "ListingStore",
    "MissingDependencyError",
    "Outcome",
    "OutcomeTooLargeError",
    "OutcomeUnknownError",
    "Record",
    "RecordState",
    "Replay",
    "Reservation",
    "ResponseTooLargeError",
    "Result",
    "SchemaError",
    "Serializer",
    "Status",
    "StoreUnavailableError",
    "Sweeper",
    "UnrecordableResultError",
    "__version__",
    "canonical_json",
    "current_execution",
    "fingerprint",
    "forget",
    "instrument",
    "open_store",
    "register_backend",
    "uninstrument",
]
