"""A completion written as one conditional ``PutItem`` of the whole completed record.

``COMPLETE_UPDATE`` under ``HOLDER_CONDITION`` plus ``ROOM_CONDITION`` completes any record,
but moto evaluates both expressions in Python: about 3.5 ms of its CPU per request against
1.8 ms for this ``PutItem`` (docs/benchmarks.md). On DynamoDB both are one write unit per KB
of the larger of the item before and after. A store that acquired the key itself (in this
process, with the lease it is asked to complete) knows every attribute of the record, so it
can write the completed record whole:

- ``#token = :token``: only the acquisition that drew this token (128 random bits, a fresh
  one per acquisition) wrote it, and that same write stored the fence it handed out; nothing
  else writes token or fence. The put is only sent when the lease's fence is the one this
  store remembers with its token, so a stored token equal to the lease's means the stored
  fence is the lease's too: ``#fence = :fence`` is implied and left out.
- ``#status = :in_progress``: a completed record is never rewritten, a released one never
  revived (a token holder may try either).
- ``#exp > :horizon``: a record past retention is absent; completing it would resurrect it.
- ``attribute_not_exists(#cp)``: the put replaces the item, so it may only replace one that
  holds nothing it does not know; and with no checkpoints its size is known here, so no room
  condition is needed. An item with checkpoints goes to the update, which keeps them.

A refused put that was an SDK retry of a landed one is recognised by its ``op`` nonce; one
refused on an item the lease still holds (say, with checkpoints this store did not write)
goes to the update, which decides; anything else was fenced out and wrote nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from idemstore.backends.dynamodb.items import (
    ITEM_LIMIT,
    TTL_ATTRIBUTE,
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

__all__ = ["WholeCompletions"]

# Acquisitions remembered, at most: past it the memory starts over, and a completion it
# forgot goes to the update, never a wrong answer.
_MAX_REMEMBERED = 4096
_CONDITION = (
    "#token = :token AND #status = :in_progress AND #exp > :horizon AND attribute_not_exists(#cp)"
)
_NAMES = ("#token", "#status", "#exp", "#cp")
_log = logging.getLogger(__name__)


class _Acquired(NamedTuple):
    """What a record holds that its lease does not say."""

    token: str
    fence: int
    fingerprint: str
    created_at: float


class WholeCompletions:
    """A store's completions by ``PutItem``: ``call`` makes one request, ``skew`` is the
    margin by which a deadline is pushed out before it counts as passed."""

    __slots__ = ("_acquired", "_call", "_denied", "_failed_item", "_skew")

    def __init__(
        self,
        call: Callable[..., Awaitable[dict[str, Any]]],
        failed_item: Callable[[Exception, str, str], Awaitable[Mapping[str, Any] | None]],
        skew: float,
    ) -> None:
        self._call = call
        self._failed_item = failed_item
        self._skew = skew
        self._acquired: dict[tuple[str, str], _Acquired] = {}
        self._denied = False

    def acquired(self, lease: Lease, fingerprint: str, created_at: float) -> None:
        """This store acquired ``lease`` with a record of no checkpoints, stored then with
        ``fingerprint`` and ``created_at``."""
        if len(self._acquired) >= _MAX_REMEMBERED:
            self._acquired.clear()
        self._acquired[lease.scope, lease.key] = _Acquired(
            lease.token, lease.fence, fingerprint, created_at
        )

    def forget(self, lease: Lease) -> None:
        """The record may now hold what was not remembered (a checkpoint), or is no longer
        this lease's to complete (released)."""
        known = self._acquired.get((lease.scope, lease.key))
        if known is not None and known.token == lease.token:
            del self._acquired[lease.scope, lease.key]

    async def complete(
        self,
        lease: Lease,
        stored: bytes,
        compressed: bool,
        now: float,
        expires_at: float,
        ttl: dict[str, str],
        besides: int,
        too_large: Callable[[int, int], ResponseTooLargeError],
    ) -> bool | None:
        """Complete by ``PutItem``: whether it landed (``False``: fenced out, nothing
        written), or ``None`` when the update must decide (a lease this store did not
        acquire as remembered, or an item with checkpoints). ``besides`` bounds the item's
        size; past ``ITEM_LIMIT`` it raises ``too_large`` before any I/O."""
        known = self._acquired.get((lease.scope, lease.key))
        if (
            self._denied
            or known is None
            or (known.token, known.fence) != (lease.token, lease.fence)
        ):
            return None  # (a stale lease leaves the current holder's memory alone)
        del self._acquired[lease.scope, lease.key]
        if besides > ITEM_LIMIT:
            raise too_large(besides, 0)
        op = new_token()
        try:
            await self._call(
                "put_item",
                Item={
                    **partition_key(lease.scope, lease.key),
                    "scope": text(lease.scope),
                    "key": text(lease.key),
                    "fingerprint": text(known.fingerprint),
                    "status": text(Status.COMPLETED.value),
                    "token": text(lease.token),
                    "fence": integer(lease.fence),
                    "created_at": number(known.created_at),
                    "expires_at": number(expires_at),
                    "response": {"B": stored},
                    "compressed": {"BOOL": compressed},
                    TTL_ATTRIBUTE: ttl,
                    "op": text(op),
                },
                ConditionExpression=_CONDITION,
                ExpressionAttributeNames=names(*_NAMES),
                ExpressionAttributeValues={
                    ":token": text(lease.token),
                    ":in_progress": text(Status.IN_PROGRESS.value),
                    ":horizon": number(now - self._skew),
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            return await self._refused(exc, lease, op, now)
        return True

    async def _refused(self, exc: Exception, lease: Lease, op: str, now: float) -> bool | None:
        if error_code(exc.__cause__ or exc) == "AccessDeniedException":
            # A role granted only UpdateItem for completions: every one goes to the update.
            self._denied = True
            _log.warning("dynamodb:PutItem denied: completions use UpdateItem (%s)", exc)
            return None
        # (A GetItem where the endpoint ignores ReturnValuesOnConditionCheckFailure on
        # PutItem, as moto does; anything but a failed condition is raised.)
        item = await self._failed_item(exc, lease.scope, lease.key) or {}
        if item.get("op", {}).get("S") == op:
            return True  # the SDK retried a put that had landed
        if held_by(item, lease, now - self._skew):
            return None  # still ours (checkpoints it did not know of): the update decides
        return False
