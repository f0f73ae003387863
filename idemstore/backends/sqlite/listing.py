"""``idemstore keys`` on SQLite: one query over the records table, the filters in its WHERE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemstore.backends.sqlite.statements import COLUMNS, decode_record
from idemstore.records import RecordState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from idemstore.protocol import Record
    from idemstore.records import RecordQuery

__all__ = ["listed"]

# A live record is neither a tombstone nor past retention (the rule of every read); the scope
# filter uses the (scope, key) unique index. Each state is RecordQuery.matches' rule in SQL.
_LIVE = "status != 'released' AND expires_at > :now"
_STATES = {
    RecordState.IN_PROGRESS: "status = 'in_progress' AND lease_expires_at > :now",
    RecordState.STUCK: (
        "status = 'in_progress' AND (lease_expires_at IS NULL OR lease_expires_at <= :now)"
    ),
    RecordState.COMPLETED: "status = 'completed'",
}


def list_statement(query: RecordQuery, now: float) -> tuple[str, dict[str, Any]]:
    """The SELECT of ``query`` at ``now``, oldest first, and its named parameters."""
    where = [_LIVE]
    parameters: dict[str, Any] = {"now": now, "limit": query.limit}
    if query.scope is not None:
        where.append("scope = :scope")
        parameters["scope"] = query.scope
    if query.state is not None:
        where.append(_STATES[query.state])
    if query.older_than is not None:
        where.append("created_at <= :born")
        parameters["born"] = now - query.older_than
    sql = (
        f"SELECT {COLUMNS} FROM idemstore_records WHERE {' AND '.join(where)}"
        " ORDER BY created_at LIMIT :limit"
    )
    return sql, parameters


async def listed(
    query: RecordQuery,
    read: Callable[[str, Mapping[str, Any]], Awaitable[list[Any]]],
    now: float,
) -> AsyncIterator[Record]:
    """The records of ``query``: one statement on the store's ``read`` connection."""
    sql, parameters = list_statement(query, now)
    for row in await read(sql, parameters):
        yield decode_record(row)
