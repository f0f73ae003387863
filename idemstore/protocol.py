"""The store contract as Python types: what every backend returns and accepts.

Times are UNIX epoch seconds (floats) from the clock that decides leases: the engine's own
where it has one (Postgres, Redis), the local one otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["IdempotencyStore", "Lease", "Outcome", "Record", "Reservation", "Status"]


class Status(enum.StrEnum):
    """Where a live record stands."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class Outcome(enum.StrEnum):
    """The one outcome of ``reserve``."""

    ACQUIRED = "acquired"
    COMPLETED = "completed"
    IN_PROGRESS = "in_progress"
    MISMATCH = "mismatch"


@dataclass(frozen=True, slots=True)
class Record:
    """A live record as a store read it.

    ``response`` is set only when ``status`` is completed; ``lease_expires_at`` only while in
    progress.
    """

    scope: str
    key: str
    fingerprint: str
    status: Status
    token: str
    fence: int
    response: bytes | None
    created_at: float
    expires_at: float
    lease_expires_at: float | None


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of ownership of a key: pass it to ``complete``, ``release`` or ``extend``.

    ``retention`` is the retention asked for at ``reserve``; ``complete`` uses it by default.
    """

    scope: str
    key: str
    token: str
    fence: int
    lease_expires_at: float
    retention: float


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve`` found: ``lease`` when acquired, ``record`` (the existing one) otherwise."""

    outcome: Outcome
    lease: Lease | None = None
    record: Record | None = None
    takeover: bool = False

    @property
    def acquired(self) -> bool:
        return self.outcome is Outcome.ACQUIRED


@runtime_checkable
class IdempotencyStore(Protocol):
    """An async store of idempotency records. See docs/semantics.md for the full contract."""

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        """Atomically claim ``(scope, key)`` or report the live record that prevents it."""
        ...

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        """Store the response; ``False`` (nothing written) when the lease was fenced out."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the key up so the next ``reserve`` acquires it with a higher fence."""
        ...

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        """Push the lease deadline to now + ``lease_ttl``; ``None`` when the lease was lost."""
        ...

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        """The live record, or ``None`` when absent, released or past retention."""
        ...

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        """Return once no live lease holds the key, or after ``timeout`` seconds."""
        ...

    async def delete(self, key: str, *, scope: str = "") -> bool:
        """Remove the record whatever its state; ``True`` when there was one."""
        ...

    async def sweep(self, *, limit: int = 1000) -> int:
        """Physically remove up to ``limit`` records past retention; return how many."""
        ...

    async def ping(self) -> None:
        """Raise ``StoreUnavailableError`` unless the engine answers."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
