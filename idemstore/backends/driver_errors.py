"""Driver-error translation: each backend declares, once, how its driver's exceptions map onto
the idemstore error family (SEMANTICS section 5), and every operation goes through it.

A backend author composes a ``DriverErrors`` from:

- ``catches``: the exception types its driver (and the sockets under it) raise;
- ``rules``: ``Rule(matches, error)`` pairs tried in order; ``matches`` is a predicate such as
  ``of_type(...)`` or ``message_has(...)``, ``error`` builds the idemstore error;
- ``otherwise``: the error for anything no rule matched (normally a
  ``StoreUnavailableError`` naming the engine, never a password).

Then ``with errors.translated(): ...`` around driver calls, ``await errors.awaited(call)``
for one awaited call, or ``raise errors.translate(exc) from exc``. What callers may rely on:
no exception in ``catches`` escapes unwrapped, the driver's exception is always the
``__cause__``, and idemstore's own errors pass untouched.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from idemstore.errors import ConfigurationError, IdemstoreError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence

__all__ = ["DriverErrors", "Rule", "message_has", "of_type", "read_only", "unavailable"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Rule:
    """When ``matches(exc)``, the driver exception becomes ``error(exc)``."""

    matches: Callable[[BaseException], bool]
    error: Callable[[BaseException], IdemstoreError]


def of_type(*types: type[BaseException]) -> Callable[[BaseException], bool]:
    """A predicate: the exception is an instance of one of ``types``."""
    return lambda exc: isinstance(exc, types)


def message_has(*fragments: str) -> Callable[[BaseException], bool]:
    """A predicate: the exception's message contains one of ``fragments``."""
    return lambda exc: any(fragment in str(exc) for fragment in fragments)


def read_only(where: str) -> Callable[[BaseException], IdemstoreError]:
    """A write refused because the transaction (or the database) is read-only: a
    ``ConfigurationError``, not "unavailable", since no retry can get past it."""

    def error(exc: BaseException) -> IdemstoreError:
        return ConfigurationError(
            f"{where} refused a write: the transaction or the database is read-only ({exc})."
            " settle(response, connection=...) and checkpoint(..., connection=...) write the"
            " outcome in the connection's transaction: open a read-write transaction"
            " (asyncpg: connection.transaction(), not readonly=True; SQLite: query_only off)"
        )

    return error


def unavailable(where: str) -> Callable[[BaseException], IdemstoreError]:
    """The usual fallback: ``StoreUnavailableError`` naming ``where`` (already redacted),
    saying whether the engine timed out or failed."""

    def error(exc: BaseException) -> IdemstoreError:
        if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
            return StoreUnavailableError(f"{where} did not answer in time")
        detail = f": {exc}" if str(exc) else ""
        return StoreUnavailableError(f"{where} failed: {type(exc).__name__}{detail}")

    return error


@dataclass(frozen=True, slots=True)
class DriverErrors:
    """How one backend's driver exceptions map onto the idemstore family."""

    catches: tuple[type[BaseException], ...]
    rules: Sequence[Rule]
    otherwise: Callable[[BaseException], IdemstoreError]

    def translate(self, exc: BaseException) -> IdemstoreError:
        """The idemstore error for ``exc``; raise it ``from exc``."""
        if isinstance(exc, IdemstoreError):
            return exc
        for rule in self.rules:
            if rule.matches(exc):
                return rule.error(exc)
        return self.otherwise(exc)

    async def awaited(self, pending: Awaitable[T]) -> T:
        """``await pending`` with its driver errors translated: what ``translated`` does, at
        a fraction of a context manager's cost, for the statements every operation runs."""
        try:
            return await pending
        except IdemstoreError:
            raise
        except self.catches as exc:
            raise self.translate(exc) from exc

    @contextlib.contextmanager
    def translated(self) -> Iterator[None]:
        """Re-raise what the block's driver calls raise as idemstore errors."""
        try:
            yield
        except IdemstoreError:
            raise
        except self.catches as exc:
            raise self.translate(exc) from exc
