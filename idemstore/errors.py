"""The idemstore error family: one root, one class per thing a caller can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from idemstore.install_lines import install_hint

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
    "OutcomeTooLargeError",
    "OutcomeUnknownError",
    "RecordChangedError",
    "ResponseTooLargeError",
    "SchemaError",
    "StoreUnavailableError",
    "UnrecordableResultError",
]


class IdemstoreError(Exception):
    """Root of every error idemstore raises on purpose."""


class ConfigurationError(IdemstoreError, ValueError):
    """A store URL or option is wrong; the message says which and what is accepted."""


class MissingDependencyError(IdemstoreError, ImportError):
    """A backend's driver is not installed; the message gives the ``pip install`` line."""

    @staticmethod
    def install_line(extra: str | None, install: str | None = None) -> str:
        """What installs a missing dependency: ``install`` when given (a backend shipped in a
        package of its own names that package), else idemstore's ``extra`` (``all`` if none)."""
        return install or install_hint(extra or "all")

    @classmethod
    def needing(
        cls, user: str, needs: str, exc: ImportError, extra: str | None, install: str | None = None
    ) -> Self:
        """``user`` (what was imported) could not import ``exc.name``, part of ``needs``:
        the error that says what installs it (``install``, else the extra)."""
        return cls(
            f"{user} needs {needs} ({exc.name} is missing): {cls.install_line(extra, install)}"
        )


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
    """The response exceeds the backend's item limit, even after compression.

    ``size`` is the response's length in bytes and ``limit`` the limit, where the raiser
    knows them (``None`` otherwise: the message then says what the engine said).
    """

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


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


class RecordChangedError(_KeyedError):
    """The record changed between the read an operator acted on and its removal: another
    caller took the key meanwhile, so nothing was removed. ``record`` is the one there now.

    Raised by ``idemstore.forget`` (and ``idemstore forget``), which removes only the record
    it read (or was told the fence of), never a new owner's.
    """


class LeaseLostError(_KeyedError):
    """The lease on the key lapsed before the work could start: nothing ran.

    Raised by ``ExecutionPolicy.begin`` (and so ``Idempotency.run``) when the store's reply
    granting the lease arrived after the lease could already have lapsed (a paused caller, a
    slow network, a driver's retry): another caller may have taken the key over meanwhile,
    so the work is not started and the key is given up. Retrying is safe.

    Also raised by ``Execution.checkpoint`` when the store refused the checkpoint because the
    key was taken over: the work must stop, its new owner resumes it.
    """


class OutcomeTooLargeError(_KeyedError, ResponseTooLargeError):
    """The key's work ran, but its result was too large for the store to record.

    The key records that instead of the result, so every retry gets this error rather than a
    second run (for the retention). ``size`` and ``limit`` (bytes, ``limit`` ``None`` when
    the store did not say) and ``fence`` (of the execution that ran) say which.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        scope: str,
        record: Record | None,
        size: int | None,
        limit: int | None,
        fence: int,
    ) -> None:
        _KeyedError.__init__(self, message, key=key, scope=scope, record=record)
        self.size = size
        self.limit = limit
        self.fence = fence


class UnrecordableResultError(_KeyedError, TypeError):
    """The key's work ran, but what it returned cannot be recorded (a mistake in the code).

    Work that returns no awaitable, or no bytes, or a decorated function's result that its
    serializer refuses. The key records that instead of the result, so every retry gets this
    error rather than a second run (for the retention); ``fence`` is the execution's.
    """

    def __init__(
        self, message: str, *, key: str, scope: str, record: Record | None, fence: int
    ) -> None:
        _KeyedError.__init__(self, message, key=key, scope=scope, record=record)
        self.fence = fence


class OutcomeUnknownError(_KeyedError):
    """The key was taken over from a holder whose outcome is unknown, and the policy is
    ``on_takeover="refuse"``: the work was not run.

    The previous holder's lease lapsed before it recorded anything: it may have done the work
    and died, or never started it. ``previous_fence`` is that holder's fence (to look its
    effects up downstream). The key records that its outcome is unknown, so every retry gets
    this error too (for the retention), until someone who knows deletes the key
    (``store.delete(key, scope=scope)``) to let it run again.
    """

    def __init__(
        self, message: str, *, key: str, scope: str, record: Record | None, previous_fence: int
    ) -> None:
        super().__init__(message, key=key, scope=scope, record=record)
        self.previous_fence = previous_fence
