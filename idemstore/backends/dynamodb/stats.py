"""``idemstore stats`` on DynamoDB: one projected Scan, bounded, classified here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import names
from idemstore.backends.stats import StatsTally

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from idemstore.backends.stats import StoreStats

    # The store's request function: one operation name and its parameters, the answer back.
    Call = Callable[..., Awaitable[dict[str, Any]]]

__all__ = ["count"]

PAGE = 1000


async def count(call: Call, now: float, limit: int) -> StoreStats:
    """One ``Scan`` of at most ``limit`` items, projected to four attributes. A Scan is billed
    for every item it reads, whole (0.5 read unit per 4 KB, eventually consistent), whatever
    its projection or filter; one projected Scan costs less than a ``Select=COUNT`` Scan per
    state, each of which would read the table again. ``call`` is the store's one request
    function; ``now`` the time deadlines are judged by (the store's clock less its skew
    margin, as every read judges them)."""
    tally = StatsTally(now)
    placeholders = names("#status", "#created", "#exp", "#lease")
    start: dict[str, Any] | None = None
    complete = False
    while tally.scanned < limit:
        page = await call(
            "scan",
            ProjectionExpression="#status, #created, #exp, #lease",
            ExpressionAttributeNames=placeholders,
            Limit=min(PAGE, limit - tally.scanned),
            **({"ExclusiveStartKey": start} if start else {}),
        )
        for item in page.get("Items", []):
            lease = item.get("lease_expires_at")
            tally.add(
                item["status"]["S"],
                float(item["created_at"]["N"]),
                float(item["expires_at"]["N"]),
                None if lease is None else float(lease["N"]),
            )
        start = page.get("LastEvaluatedKey")
        if not start:
            complete = True
            break
    method = "one Scan of the table, projected (billed for every item read, whole)"
    return tally.result(complete=complete, method=method)
