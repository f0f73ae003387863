"""``idemstore keys`` on DynamoDB: a paged Scan, the filters in its FilterExpression."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import decode_record, names

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from idemstore.backends.dynamodb.stats import Call
    from idemstore.protocol import Record
    from idemstore.records import RecordQuery

__all__ = ["listed"]

PAGE = 1000
# Live items only (no released tombstone, within retention; the ping item has no status),
# then the scope and the status. A Scan is billed for every item it reads, filtered or not:
# the filter only spares the transfer. Lease deadlines and ages are judged here, by
# RecordQuery.matches, at the store's clock less its skew margin (as every read judges them).
_LIVE = "attribute_exists(#status) AND #status <> :released AND #exp > :now"


def scan_parameters(query: RecordQuery, now: float) -> dict[str, Any]:
    """The Scan's parameters (but the page's start) for ``query`` at ``now``."""
    condition = [_LIVE]
    placeholders = ["#status", "#exp"]
    values: dict[str, Any] = {":released": {"S": "released"}, ":now": {"N": repr(now)}}
    if query.scope is not None:
        condition.append("#scope = :scope")
        placeholders.append("#scope")
        values[":scope"] = {"S": query.scope}
    if query.state is not None:
        condition.append("#status = :status")
        status = "completed" if query.state.value == "completed" else "in_progress"
        values[":status"] = {"S": status}
    return {
        "FilterExpression": " AND ".join(condition),
        "ExpressionAttributeNames": names(*placeholders),
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
    }


async def listed(call: Call, now: float, query: RecordQuery) -> AsyncIterator[Record]:
    """The records of ``query``: a Scan, page by page, until the envelope has enough."""
    parameters = scan_parameters(query, now)
    start: dict[str, Any] | None = None
    while True:
        page = await call(
            "scan", Limit=PAGE, **parameters, **({"ExclusiveStartKey": start} if start else {})
        )
        for item in page.get("Items", []):
            record = decode_record(item)
            if query.matches(record, now):
                yield record
        start = page.get("LastEvaluatedKey")
        if not start:
            return
