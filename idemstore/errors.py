"""The idemstore error family: one root, one class per thing a caller can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemstore.protocol import Record

__all__ = [
    "CanonicalizationError",
    "ConfigurationError",
    "ConflictError",
    "IdemstoreError",
    "InProgressError",
    "InvalidKeyError",
    "LeaseLostError",
    "MissingDependencyError",
    "ResponseTooLargeError",
    "SchemaError",
    "StoreUnavailableError",
]


class IdemstoreError(Exception):
    """Root of every error idemstore raises on purpose."""


class ConfigurationError(IdemstoreError, ValueError):
    """A store URL or option is wrong; the message says which and what is accepted."""


class MissingDependencyError(IdemstoreError, ImportError):
    """A backend's driver is not installed; the message gives the ``pip install`` line."""


class StoreUnavailableError(IdemstoreError):
    """The engine could not be reached or did not answer in time.

    The driver's own exception is chained as ``__cause__``. Whether the operation took
    effect is unknown: retry it (every store operation is safe to retry).
    """


class SchemaError(IdemstoreError):
    """The store's schema is missing or older than this code: run ``idemstore migrate URL``."""


class InvalidKeyError(IdemstoreError, ValueError):
    """A key, scope or fingerprint is outside what every backend accepts alike."""


class ResponseTooLargeError(IdemstoreError, ValueError):
    """The response exceeds the backend's item limit, even after compression."""


class CanonicalizationError(IdemstoreError, ValueError):
    """A value cannot be put in canonical JSON form (NaN, infinity, a non-JSON type, ...).

    ``path`` names where in the value the problem is, as a JSON-pointer-like string.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{message} at {path or '/'}")
        self.path = path


class _KeyedError(IdemstoreError):
    """An error about one key, carrying the record the store holds for it."""

    def __init__(self, message: str, *, key: str, scope: str, record: Record | None) -> None:
        super().__init__(message)
        self.key = key
        self.scope = scope
        self.record = record


class ConflictError(_KeyedError):
    """The key was used before with different arguments (a fingerprint mismatch)."""


class InProgressError(_KeyedError):
    """Another caller holds the key and the policy is not to wait (or the wait timed out)."""


class LeaseLostError(_KeyedError):
    """The lease on the key was lost (it lapsed and another caller took the key over)."""
