"""A reserve with nothing under its key: one conditional ``PutItem`` of the whole record.

``RESERVE_UPDATE`` under ``RESERVE_CONDITION`` is the reserve that decides every case (it
continues the fence of a tombstone or an expired record and takes a lapsed lease over), but
an endpoint may charge for its weight: moto evaluates both expressions in Python, about 9 ms
of its CPU per request against 2 ms for this ``PutItem`` (docs/benchmarks.md); on DynamoDB
either is one write unit per KB of the item, a failed condition included. So a reserve sends
the ``PutItem`` first for a key it has not acquired itself. A key it acquired goes straight
to the update, as before: a takeover or re-claim of it stays one request, and so does a replay
on an endpoint that ignores ``ReturnValuesOnConditionCheckFailure`` on ``PutItem`` (moto
does: a failed put there costs a ``GetItem`` more). A key it does not remember that turns out
replaceable (another process's lapsed lease or tombstone, a record past retention) costs the
``PutItem`` and then the update.

A key this store completed itself is read first (a consistent ``GetItem``): a retry that comes
back to the process that ran it is answered from the record, for one read unit per 4 KB of it
where the update's refused write costs a write unit per KB, and without the update's
expressions (which moto evaluates in Python, about 3 ms of its CPU). A record gone or past
retention meanwhile costs the read more, then the update decides.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import (
    FIRST_CLAIM_CONDITION,
    TTL_ATTRIBUTE,
    decode_record,
    error_code,
    integer,
    names,
    number,
    partition_key,
    text,
)
from idemstore.backends.envelope import lost_reserve
from idemstore.protocol import Lease, Outcome, Reservation, Status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

__all__ = ["FirstClaims", "landed"]

# Keys remembered as acquired here, at most: past it the memory starts over, and a key it
# forgot costs one more request when it turns out replaceable, never a wrong answer.
_MAX_REMEMBERED = 4096
_IN_PROGRESS = Status.IN_PROGRESS.value
_COMPLETED = Status.COMPLETED.value
_log = logging.getLogger(__name__)


def landed(item: Mapping[str, Any], claim: Lease) -> Reservation:
    """The SDK retried a reserve that had landed (the item holds ``claim``'s token): the key
    is ours, with the fence and lease deadline the write stored."""
    record = decode_record(item)
    assert record.lease_expires_at is not None
    lease = Lease(
        claim.scope, claim.key, claim.token, record.fence, record.lease_expires_at, claim.retention
    )
    return Reservation(Outcome.ACQUIRED, lease=lease)


def _remember(keys: set[tuple[str, str]], scope: str, key: str) -> None:
    """Add the key; past ``_MAX_REMEMBERED`` the memory starts over."""
    if len(keys) >= _MAX_REMEMBERED:
        keys.clear()
    keys.add((scope, key))


class FirstClaims:
    """A store's first claims: ``call`` makes one request, ``failed_item`` reads the item a
    conditional write failed on, ``live`` says whether an item is a live record at a time."""

    __slots__ = (
        "_call",
        "_completed",
        "_denied",
        "_failed_item",
        "_live",
        "_remembered",
        "_skew",
    )

    def __init__(
        self,
        call: Callable[..., Awaitable[dict[str, Any]]],
        failed_item: Callable[[Exception, str, str], Awaitable[Mapping[str, Any] | None]],
        live: Callable[[Mapping[str, Any] | None, float], bool],
        skew: float,
    ) -> None:
        self._call = call
        self._failed_item = failed_item
        self._live = live
        self._skew = skew
        self._remembered: set[tuple[str, str]] = set()
        self._completed: set[tuple[str, str]] = set()
        self._denied = False

    def held(self, scope: str, key: str) -> None:
        """This store acquired the key: its next reserve goes to the update."""
        _remember(self._remembered, scope, key)

    def completed(self, scope: str, key: str) -> None:
        """This store completed the key: its next reserve reads the record first."""
        _remember(self._completed, scope, key)

    async def _replay(
        self, scope: str, key: str, fingerprint: str, now: float
    ) -> Reservation | None:
        """The outcome of a key this store completed, read; ``None`` when the record is no
        longer a live completed one (forgotten, past retention): the update decides."""
        self._completed.discard((scope, key))
        read = await self._call("get_item", Key=partition_key(scope, key), ConsistentRead=True)
        item = read.get("Item")
        if item is None or not self._live(item, now) or item["status"]["S"] != _COMPLETED:
            return None
        self._completed.add((scope, key))
        return lost_reserve(decode_record(item), fingerprint)

    async def claim(
        self, claim: Lease, fingerprint: str, now: float, expires_at: float, ttl: dict[str, str]
    ) -> Reservation | None:
        """``claim`` (fence 1) when nothing is under the key; the outcome when a live record
        that may not be taken is; ``None`` when the update must decide (a remembered key, an
        item it may replace, or none left by the time it was read)."""
        scope, key = claim.scope, claim.key
        if (scope, key) in self._completed:
            return await self._replay(scope, key, fingerprint, now)
        if self._denied or (scope, key) in self._remembered:
            return None
        try:
            await self._call(
                "put_item",
                Item={
                    **partition_key(scope, key),
                    "scope": text(scope),
                    "key": text(key),
                    "fingerprint": text(fingerprint),
                    "status": text(_IN_PROGRESS),
                    "token": text(claim.token),
                    "fence": integer(1),
                    "created_at": number(now),
                    "expires_at": number(expires_at),
                    "lease_expires_at": number(claim.lease_expires_at),
                    TTL_ATTRIBUTE: ttl,
                },
                ConditionExpression=FIRST_CLAIM_CONDITION,
                ExpressionAttributeNames=names("#pk"),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            if error_code(exc.__cause__ or exc) == "AccessDeniedException":
                # A role granted only what earlier versions used (no dynamodb:PutItem): every
                # reserve goes to the update, which that role may send.
                self._denied = True
                _log.warning("dynamodb:PutItem denied: reserves use UpdateItem only (%s)", exc)
                return None
            item = await self._failed_item(exc, scope, key)
            if item is not None and item.get("token", {}).get("S") == claim.token:
                return landed(item, claim)
            if item is None or not self._live(item, now):
                return None
            if (
                item["status"]["S"] == _IN_PROGRESS
                and item["fingerprint"]["S"] == fingerprint
                and float(item["lease_expires_at"]["N"]) <= now - self._skew
            ):
                return None  # a lapsed lease of this fingerprint: a takeover
            return lost_reserve(decode_record(item), fingerprint)
        return Reservation(Outcome.ACQUIRED, lease=claim)
