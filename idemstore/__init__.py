"""idemstore: make retried operations safe by recording each under an idempotency key."""

from __future__ import annotations

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
from idemstore.execution import Execution, ExecutionPolicy, LeaseKeeper, Replay, current_execution
from idemstore.hashing import canonical_json, fingerprint
from idemstore.protocol import (
    Checkpoint,
    CheckpointingStore,
    IdempotencyStore,
    Lease,
    Outcome,
    Record,
    Reservation,
    Status,
)
from idemstore.registry import Engine, FixtureVariant
from idemstore.runner import Idempotency, Result
from idemstore.serializers import JSONSerializer, Serializer
from idemstore.sweeper import Sweeper
from idemstore.telemetry import instrument, uninstrument
from idemstore.urls import open_store, register_backend

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
    "InvalidKeyError",
    "JSONSerializer",
    "Lease",
    "LeaseKeeper",
    "LeaseLostError",
    "MissingDependencyError",
    "Outcome",
    "OutcomeTooLargeError",
    "OutcomeUnknownError",
    "Record",
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
    "instrument",
    "open_store",
    "register_backend",
    "uninstrument",
]
