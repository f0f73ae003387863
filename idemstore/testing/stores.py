"""Stores that wrap the store under test and change one of its answers, as a faulty engine or
a slow network would, so that what the runner makes of that answer is tested on every backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.errors import ResponseTooLargeError

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore, Lease

__all__ = ["SizeLimitedStore", "WrappedStore"]


class WrappedStore:
    """Every call goes to ``inner``; a subclass overrides the calls it changes."""

    def __init__(self, inner: IdempotencyStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SizeLimitedStore(WrappedStore):
    """``inner``, except that ``complete`` refuses a response over ``limit`` bytes with
    ``ResponseTooLargeError``, as an engine with an item limit (DynamoDB's 400 KB) does."""

    def __init__(self, inner: IdempotencyStore, limit: int) -> None:
        super().__init__(inner)
        self.limit = limit

    async def complete(self, lease: Lease, response: bytes, **options: Any) -> bool:
        if len(response) > self.limit:
            raise ResponseTooLargeError(f"over the item limit of {self.limit} bytes")
        return await self.inner.complete(lease, response, **options)
