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
    ResponseTooLargeError,
    SchemaError,
    StoreUnavailableError,
)
from idemstore.execution import Execution, ExecutionPolicy, LeaseKeeper, Replay
from idemstore.hashing import canonical_json, fingerprint
from idemstore.protocol import IdempotencyStore, Lease, Outcome, Record, Reservation, Status
from idemstore.registry import Engine, FixtureVariant
from idemstore.runner import Idempotency, Result
from idemstore.sweeper import Sweeper
from idemstore.urls import open_store, register_backend

__version__ = "0.1.0"

__all__ = [
    "CanonicalizationError",
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
    "Lease",
    "LeaseKeeper",
    "LeaseLostError",
    "MissingDependencyError",
    "Outcome",
    "Record",
    "Replay",
    "Reservation",
    "ResponseTooLargeError",
    "Result",
    "SchemaError",
    "Status",
    "StoreUnavailableError",
    "Sweeper",
    "__version__",
    "canonical_json",
    "fingerprint",
    "open_store",
    "register_backend",
]
