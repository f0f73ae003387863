"""What a record may take of DynamoDB's 400 KB item, and the errors that say it would not fit.

The store checks a write that grows an item (a completion, a checkpoint) against these bounds
before it sends it, and again with the checkpoints the item really holds when DynamoDB refuses
it, so an oversized record is refused with a typed error and never half-written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.dynamodb.items import CHECKPOINTS_ATTRIBUTE_BYTES, utf8_len
from idemstore.errors import ResponseTooLargeError
from idemstore.records import MAX_FINGERPRINT_LENGTH

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import Lease

__all__ = ["checkpoint_bytes", "checkpoint_too_large", "response_bytes", "response_too_large"]

# Bytes an item takes besides the identity strings and the response: attribute names, the
# pk, token, op, numbers (at most 21 bytes each) and the flag, with room to spare.
_ITEM_OVERHEAD = 512


def _identity_bytes(lease: Lease) -> int:
    """An upper bound of what a record takes besides its response and checkpoints."""
    return _ITEM_OVERHEAD + utf8_len(lease.scope) + utf8_len(lease.key) + 4 * MAX_FINGERPRINT_LENGTH


def response_bytes(lease: Lease, stored: bytes) -> int:
    """What a completed record takes besides the checkpoints it holds."""
    return _identity_bytes(lease) + CHECKPOINTS_ATTRIBUTE_BYTES + len(stored)


def checkpoint_bytes(lease: Lease, entry: bytes) -> int:
    """What a record takes with one more checkpoint, besides those it already holds."""
    return _identity_bytes(lease) + CHECKPOINTS_ATTRIBUTE_BYTES + 1 + len(entry)


def response_too_large(
    response: bytes, stored: bytes, compressed: bool
) -> Callable[[int, int], ResponseTooLargeError]:
    """The error for a completion that would not fit, given the size it would reach and the
    number of checkpoints the record holds."""

    def too_large(size: int, checkpoints: int) -> ResponseTooLargeError:
        # The record stays in progress: the lease can still be released (or completed with a
        # smaller response).
        held = f" and its {checkpoints} checkpoints" if checkpoints else ""
        return ResponseTooLargeError(
            f"the response is {len(response)} bytes ({len(stored)} stored"
            f"{' after zlib' if compressed else ''}); with the record{held} it would "
            f"exceed DynamoDB's 400 KB item limit. Store large results elsewhere and "
            "record a reference, or release the lease",
            size=len(response),
        )

    return too_large


def checkpoint_too_large(
    lease: Lease, name: str, data: bytes
) -> Callable[[int, int], ResponseTooLargeError]:
    """The error for a checkpoint that would not fit beside the record's others."""

    def too_large(size: int, checkpoints: int) -> ResponseTooLargeError:
        # The key is named by its length: past the limit, it is most likely the longest part.
        held = f" beside its {checkpoints} checkpoints" if checkpoints else ""
        return ResponseTooLargeError(
            f"checkpoint {name!r} ({len(data)} bytes of data){held} would take the record "
            f"(its key is {utf8_len(lease.key)} bytes) past DynamoDB's 400 KB item limit: "
            "record fewer steps, or use shorter keys"
        )

    return too_large
