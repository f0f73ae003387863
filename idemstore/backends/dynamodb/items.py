"""How a record is one DynamoDB item: its attributes, the expressions that read and write it,
and the conversions between items and ``Record``.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import TYPE_CHECKING, Any

from idemstore.checkpoints import (
    MAX_CHECKPOINT_DATA,
    MAX_CHECKPOINT_NAME,
    decode_checkpoints,
    encode_checkpoint,
)
from idemstore.protocol import Checkpoint, Record, Status

if TYPE_CHECKING:
    from collections.abc import Mapping

    from idemstore.protocol import Lease

__all__ = [
    "CHECKPOINTS_ATTRIBUTE_BYTES",
    "CHECKPOINT_CONDITION",
    "CHECKPOINT_ENTRY_BYTES",
    "CHECKPOINT_UPDATE",
    "COMPLETE_UPDATE",
    "DROP_CHECKPOINTS_UPDATE",
    "EXTEND_CONDITION",
    "EXTEND_UPDATE",
    "FIRST_CLAIM_CONDITION",
    "HOLDER_CONDITION",
    "HOLDER_NAMES",
    "ITEM_LIMIT",
    "RELEASE_UPDATE",
    "RESERVE_CONDITION",
    "RESERVE_NAMES",
    "RESERVE_UPDATE",
    "ROOM_CONDITION",
    "SWEEP_FILTER",
    "TTL_ATTRIBUTE",
    "checkpoint_sizes",
    "confirmed_retry",
    "decode_record",
    "encode_response",
    "error_code",
    "error_message",
    "held_by",
    "integer",
    "item_checkpoints",
    "names",
    "number",
    "partition_key",
    "text",
    "utf8_len",
]

# -- the item ------------------------------------------------------------------------------
#
# pk               S  SHA-256 (hex) of scope NUL key: fixed size whatever the scope and key
#                     (DynamoDB caps a partition key at 2048 bytes) and evenly spread over
#                     partitions; NUL cannot occur in either, so no two identities collide.
# scope, key       S  the identity as given, returned by reads
# fingerprint      S
# status           S  in_progress | completed | released (a tombstone that keeps the fence)
# token            S  owner token of the current or last lease
# fence            N  rises with every acquisition while the item exists
# created_at       N  epoch seconds (float)
# expires_at       N  retention deadline (float); past it the item is absent for every read
# lease_expires_at N  only while in progress
# response         B  only when completed; zlib-compressed when ``compressed`` is true
# compressed       BOOL
# ttl              N  whole epoch seconds for DynamoDB TTL: expires_at + clock_skew, rounded up
# op               S  nonce of the last complete/release/extend/checkpoint (see _confirmed_retry)
# checkpoints      L  recovery points, oldest first: each a B of idemstore.checkpoints' form

TTL_ATTRIBUTE = "ttl"
ITEM_LIMIT = 400 * 1024  # DynamoDB's item size limit, names and values together
# DynamoDB sizes a list as 3 bytes plus 1 byte per element plus the elements: the attribute
# costs its name and the 3, each checkpoint its stored form and 1 byte.
CHECKPOINTS_ATTRIBUTE_BYTES = len("checkpoints") + 3
# The most one checkpoint adds: its element byte, header, name (4 bytes a character in
# UTF-8) and data.
CHECKPOINT_ENTRY_BYTES = (
    1 + len(encode_checkpoint("", b"")) + 4 * MAX_CHECKPOINT_NAME + MAX_CHECKPOINT_DATA
)

_NAMES = {
    "#pk": "pk",
    "#scope": "scope",
    "#key": "key",
    "#fp": "fingerprint",
    "#status": "status",
    "#token": "token",
    "#fence": "fence",
    "#created": "created_at",
    "#exp": "expires_at",
    "#lease": "lease_expires_at",
    "#response": "response",
    "#compressed": "compressed",
    "#ttl": TTL_ATTRIBUTE,
    "#op": "op",
    "#cp": "checkpoints",
}

# ``:horizon`` is now - clock_skew: a deadline has passed once it is at or before it.

# Whom reserve may replace, in one atomic step: nobody (no item); a record past retention
# (absent to every read; TTL may not have deleted it yet); a released tombstone; or a lapsed
# lease of the *same* fingerprint (a takeover: a mismatch never takes a key over). Anything
# else fails the condition and comes back as ALL_OLD, so a lost race costs no GetItem.
RESERVE_CONDITION = (
    "attribute_not_exists(#pk)"
    " OR #exp <= :horizon"
    " OR #status = :released"
    " OR (#status = :in_progress AND #lease <= :horizon AND #fp = :fp)"
)
# Most reserves find nothing under the key: a plain PutItem of the whole record claims it.
# Any item at all fails this and comes back as ALL_OLD: a live record that may not be taken
# answers the reserve from there, and only a tombstone, a record past retention or a lapsed
# lease (which RESERVE_CONDITION may replace, continuing its fence) costs an UpdateItem more.
FIRST_CLAIM_CONDITION = "attribute_not_exists(#pk)"
# The fence is read and raised inside the same write, so two reservers can never be handed
# the same fence, and a tombstone or expired item that still exists passes its fence on.
RESERVE_UPDATE = (
    "SET #scope = :scope, #key = :key, #fp = :fp, #status = :in_progress, #token = :token,"
    " #created = :now, #exp = :exp, #lease = :lease, #ttl = :ttl,"
    " #fence = if_not_exists(#fence, :zero) + :one"
    " REMOVE #response, #compressed, #op"
)
RESERVE_NAMES = (
    *("#pk", "#scope", "#key", "#fp", "#status", "#token", "#fence", "#created"),
    *("#exp", "#lease", "#ttl", "#response", "#compressed", "#op"),
)

# Only the current holder may finish: its token AND fence (a stale owner's lease carries an
# older pair once a takeover or re-claim happened), still in progress (a completed record is
# never rewritten, a released one never revived), and not past retention (an expired record
# is absent: finishing it would resurrect it under a reserver that already saw it gone).
HOLDER_CONDITION = (
    "#token = :token AND #fence = :fence AND #status = :in_progress AND #exp > :horizon"
)
# ``extend`` also refuses a lapsed lease: someone else may already be entitled to take it.
EXTEND_CONDITION = HOLDER_CONDITION + " AND #lease > :horizon"

COMPLETE_UPDATE = (
    "SET #status = :completed, #response = :response, #compressed = :compressed,"
    " #exp = :exp, #ttl = :ttl, #op = :op REMOVE #lease"
)
# A write that grows the item must keep it within ITEM_LIMIT, but the holder's checkpoints
# are not known without a read: the write goes through only while there are at most :most
# of them (as many as fit at their largest). Past that, the refused item (ALL_OLD) tells
# their real size, so an item that would not fit is refused before it is written, never by
# DynamoDB's size check half-way through.
ROOM_CONDITION = " AND (attribute_not_exists(#cp) OR size(#cp) <= :most)"
# A tombstone keeps fence and retention: the next acquisition continues the fence. Its
# checkpoints go: the next acquisition is no takeover and starts the work afresh.
RELEASE_UPDATE = "SET #status = :released, #op = :op REMOVE #lease, #cp"
# A recovery point, appended by the holder. The nonce condition makes an SDK retry of an
# append that landed fail (then confirmed by its nonce) instead of appending the step twice.
CHECKPOINT_UPDATE = "SET #cp = list_append(if_not_exists(#cp, :empty), :entry), #op = :op"
CHECKPOINT_CONDITION = HOLDER_CONDITION + " AND (attribute_not_exists(#op) OR #op <> :op)"
# What reserve follows up with when it reused a record past retention that held checkpoints.
DROP_CHECKPOINTS_UPDATE = "SET #op = :op REMOVE #cp"
# A heartbeat restarts retention too (``:exp`` is at least the new lease): a live lease keeps
# its item, and DynamoDB's TTL follows.
EXTEND_UPDATE = "SET #lease = :lease, #exp = :exp, #ttl = :ttl, #op = :op"
HOLDER_NAMES = ("#token", "#fence", "#status", "#exp", "#op")

# Sweep deletes only what is still past retention when the delete lands: a key reserved
# again between the scan and the delete is left alone.
SWEEP_FILTER = "#exp <= :horizon"


def names(*placeholders: str) -> dict[str, str]:
    # DynamoDB rejects unused placeholders, so each request names exactly what it uses.
    return {p: _NAMES[p] for p in placeholders}


def number(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


def integer(value: int) -> dict[str, str]:
    return {"N": str(value)}


def text(value: str) -> dict[str, str]:
    return {"S": value}


def partition_key(scope: str, key: str) -> dict[str, dict[str, str]]:
    digest = hashlib.sha256(scope.encode() + b"\x00" + key.encode()).hexdigest()
    return {"pk": {"S": digest}}


def utf8_len(text: str) -> int:
    return len(text.encode())


def decode_record(item: Mapping[str, Any]) -> Record:
    status = Status(item["status"]["S"])
    response: bytes | None = None
    if status is Status.COMPLETED and "response" in item:
        response = bytes(item["response"]["B"])
        if item.get("compressed", {}).get("BOOL", False):
            response = zlib.decompress(response)
    elif status is Status.COMPLETED:
        response = b""
    lease = item.get("lease_expires_at")
    return Record(
        scope=item["scope"]["S"],
        key=item["key"]["S"],
        fingerprint=item["fingerprint"]["S"],
        status=status,
        token=item["token"]["S"],
        fence=int(item["fence"]["N"]),
        response=response,
        created_at=float(item["created_at"]["N"]),
        expires_at=float(item["expires_at"]["N"]),
        lease_expires_at=(
            float(lease["N"]) if status is Status.IN_PROGRESS and lease is not None else None
        ),
        checkpoints=item_checkpoints(item),
    )


def item_checkpoints(item: Mapping[str, Any]) -> tuple[Checkpoint, ...]:
    """The recovery points an item holds (none when it has no ``checkpoints``)."""
    stored = item.get("checkpoints")
    if not stored:
        return ()
    return decode_checkpoints(b"".join(bytes(entry["B"]) for entry in stored["L"]))


def checkpoint_sizes(item: Mapping[str, Any]) -> tuple[int, ...]:
    """The stored length of each recovery point an item holds."""
    stored = item.get("checkpoints")
    return tuple(len(entry["B"]) for entry in stored["L"]) if stored else ()


def held_by(item: Mapping[str, Any], lease: Lease, horizon: float) -> bool:
    """Whether ``item`` still passes ``HOLDER_CONDITION`` for ``lease``."""
    return (
        item.get("token", {}).get("S") == lease.token
        and item.get("fence", {}).get("N") == str(lease.fence)
        and item.get("status", {}).get("S") == Status.IN_PROGRESS.value
        and float(item.get("expires_at", {}).get("N", "-inf")) > horizon
    )


def confirmed_retry(exc: BaseException, op: str) -> bool:
    """Whether a failed holder write had in fact landed: the SDK retried it (say, after a
    timeout) and the retry found the nonce of its own first attempt."""
    item = getattr(exc, "response", {}).get("Item") or {}
    return bool(item.get("op", {}).get("S") == op)


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", ""))
    return str(exc)


def encode_response(response: bytes, compress_min_bytes: int) -> tuple[bytes, bool]:
    """The response as stored, and whether it is zlib-compressed: only from
    ``compress_min_bytes`` on, and only when that makes it smaller."""
    if len(response) >= compress_min_bytes and response:
        packed = zlib.compress(response, 6)
        if len(packed) < len(response):
            return packed, True
    return response, False
