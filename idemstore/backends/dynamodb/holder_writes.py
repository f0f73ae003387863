"""The writes only a key's lease holder may make (complete, checkpoint, release, extend),
each a conditional ``UpdateItem`` fenced by token and fence, and kept within DynamoDB's item
limit when it grows the item: a write the endpoint refuses tells the holder whether it was
fenced out or the item would not fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import (
    CHECKPOINT_ENTRY_BYTES,
    ITEM_LIMIT,
    ROOM_CONDITION,
    checkpoint_sizes,
    confirmed_retry,
    error_code,
    held_by,
    integer,
    names,
    number,
    partition_key,
    text,
)
from idemstore.protocol import Status
from idemstore.records import new_token

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from idemstore.errors import ResponseTooLargeError
    from idemstore.protocol import Lease

__all__ = ["HolderWrites"]


class HolderWrites:
    """A store's holder writes: ``call`` makes one request (``"update_item"`` or
    ``"get_item"`` with its parameters), ``clock`` reads the time, ``skew`` is the margin by
    which a deadline is pushed out before it counts as passed."""

    __slots__ = ("_call", "_clock", "_skew")

    def __init__(
        self,
        call: Callable[..., Awaitable[dict[str, Any]]],
        clock: Callable[[], float],
        skew: float,
    ) -> None:
        self._call = call
        self._clock = clock
        self._skew = skew

    async def write(
        self,
        lease: Lease,
        update: str,
        condition: str,
        placeholders: tuple[str, ...],
        values: dict[str, Any],
        now: float,
    ) -> bool:
        """A write only the lease holder may make; ``False`` when fenced out."""
        refused = await self._try(lease, update, condition, placeholders, values, now)
        return refused is None

    async def _try(
        self,
        lease: Lease,
        update: str,
        condition: str,
        placeholders: tuple[str, ...],
        values: dict[str, Any],
        now: float,
    ) -> Mapping[str, Any] | None:
        """A write only the lease holder may make: ``None`` once it landed, else the item
        whose condition refused it as the endpoint returned it (``{}``: none)."""
        op = new_token()
        try:
            await self._call(
                "update_item",
                Key=partition_key(lease.scope, lease.key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names(*placeholders),
                ExpressionAttributeValues={
                    ":token": text(lease.token),
                    ":fence": integer(lease.fence),
                    ":in_progress": text(Status.IN_PROGRESS.value),
                    ":horizon": number(now - self._skew),
                    ":op": text(op),
                    **values,
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            if confirmed_retry(exc, op):
                return None
            item: Mapping[str, Any] = getattr(exc, "response", {}).get("Item") or {}
            return item
        return None

    async def within_limit(
        self,
        lease: Lease,
        update: str,
        condition: str,
        placeholders: tuple[str, ...],
        values: dict[str, Any],
        besides: int,
        too_large: Callable[[int, int], ResponseTooLargeError],
    ) -> bool:
        """A holder write after which the item, ``besides`` bytes plus the checkpoints it
        already holds, stays within ``ITEM_LIMIT``; ``False`` when fenced out. An item that
        would not fit raises ``too_large(size, checkpoints)`` and is left as it was."""
        if besides > ITEM_LIMIT:
            raise too_large(besides, 0)  # refused before any I/O
        most = (ITEM_LIMIT - besides) // CHECKPOINT_ENTRY_BYTES
        while True:
            now = self._clock()
            refused = await self._try(
                lease,
                update,
                condition + ROOM_CONDITION,
                (*placeholders, "#cp"),
                {**values, ":most": integer(most)},
                now,
            )
            if refused is None:
                return True
            if not refused:
                # Gone, or an endpoint that ignores ReturnValuesOnConditionCheckFailure.
                read = await self._call(
                    "get_item", Key=partition_key(lease.scope, lease.key), ConsistentRead=True
                )
                refused = read.get("Item") or {}
            if not held_by(refused, lease, now - self._skew):
                return False
            held = checkpoint_sizes(refused)
            size = besides + sum(1 + entry for entry in held)
            if size > ITEM_LIMIT:
                raise too_large(size, len(held))
            # They fit as they are: only an append in between could refuse the write again,
            # and each append brings the item closer to a refusal, so this ends.
            most = len(held)
