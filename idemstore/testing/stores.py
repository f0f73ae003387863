"""Stores that wrap the store under test and change one of its answers, as a faulty engine or
a slow network would, so that what the runner makes of that answer is tested on every backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.errors import ResponseTooLargeError
from idemstore.protocol import ForwardingStore

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["SizeLimitedStore", "WrappedStore"]


class WrappedStore(ForwardingStore):
    """Every call goes to ``inner``; a subclass overrides the calls (or the hooks, see
    ``ForwardingStore``) it changes."""

    def __init__(self, inner: IdempotencyStore) -> None:
        super().__init__(inner)

    @property
    def inner(self) -> IdempotencyStore:
        """The store under test (``wrapped``)."""
        return self.wrapped


class SizeLimitedStore(WrappedStore):
    """``inner``, except that ``complete`` refuses a response over ``limit`` bytes with
    ``ResponseTooLargeError``, as an engine with an item limit (DynamoDB's 400 KB) does."""

    def __init__(self, inner: IdempotencyStore, limit: int) -> None:
        super().__init__(inner)
        self.limit = limit

    async def _complete(self, lease: Lease, response: bytes, retention: float | None) -> bool:
        if len(response) > self.limit:
            raise ResponseTooLargeError(f"over the item limit of {self.limit} bytes")
        return await super()._complete(lease, response, retention)
