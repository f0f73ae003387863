"""Work functions for runner tests: ``async def`` functions, as the runner requires, that
return a value or raise an error, so a test names the outcome instead of defining the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["raises", "returns"]


def returns(value: bytes) -> Callable[[], Awaitable[bytes]]:
    """Work that returns ``value``."""

    async def work() -> bytes:
        return value

    return work


def raises(error: Exception) -> Callable[[], Awaitable[bytes]]:
    """Work that raises ``error``, as work that failed (or whose side effect is unknown) does."""

    async def work() -> bytes:
        raise error

    return work
