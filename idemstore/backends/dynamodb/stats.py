"""``idemstore stats`` on DynamoDB: one projected Scan, bounded, classified here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import names
from idemstore.records import check_limit
from idemstore.stats import DEFAULT_LIMIT, StatsTally, StoreStats

if TYPE_CHECKING:
    from idemstore.backends.dynamodb.store import DynamoDBStore

__all__ = ["stats"]

PAGE = 1000


async def stats(store: DynamoDBStore, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
    """One ``Scan`` of at most ``limit`` items, projected to four attributes. A Scan is billed
    for every item it reads, whole (0.5 read unit per 4 KB, eventually consistent), whatever
    its projection or filter; one projected Scan costs less than a ``Select=COUNT`` Scan per
    state, each of which would read the table again."""
    limit = check_limit(limit)
    # Deadlines count as passed by the same margin every read applies (clock_skew).
    tally = StatsTally(store._clock() - store._skew)
    placeholders = names("#status", "#created", "#exp", "#lease")
    start: dict[str, Any] | None = None
    complete = False
    while tally.scanned < limit:
        page = await store._call(
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
