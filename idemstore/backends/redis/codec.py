"""How a record lives in Redis: its key name, and its hash fields as Python values.

A record is one hash. Fields: st (p = in progress, c = completed, r = released tombstone), fp,
tok, fen, ca / ea / la (created, retention deadline, lease deadline: microseconds of the server
clock), tk (1 when the lease was a takeover), res (the response, raw bytes), op (the nonce of
the complete or release that finished the lease), cp (the checkpoints: concatenated entries of
``idemstore.checkpoints``), cn (the nonce of the last checkpoint appended). The key
expires by itself at ea + grace; until then the scripts treat it as gone once ea has passed,
so no read ever returns an expired record, yet the fence still continues.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import unquote

from idemstore.checkpoints import decode_checkpoints
from idemstore.protocol import Record, Status

__all__ = [
    "GLOB_SPECIAL",
    "MAX_DURATION",
    "decode_record",
    "identity_of",
    "integer",
    "key_ttl_ms",
    "micros",
    "record_key",
    "seconds",
]

# Braces would end the hash tag early and '%' is the escape itself. The scope also escapes
# ':' so that the first ':' inside the tag separates scope from key: ("a:b", "c") and
# ("a", "b:c") become "{a%3Ab:c}" and "{a:b:c}".
_KEY_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_SCOPE_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D", ":": "%3A"})
GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def record_key(prefix: str, scope: str, key: str) -> bytes:
    """The Redis key of ``(scope, key)``: ``PREFIX{scope:key}``, escaped, all in the hash tag.

    The whole identity is the hash tag, so a record and anything tied to it share a slot.
    """
    # str.translate with a mapping costs a dict lookup per character (about 1 µs for a short
    # key): a key without the three characters is its own escape, and a scope's head is
    # remembered (callers use a handful of scopes).
    if "%" in key or "{" in key or "}" in key:
        key = key.translate(_KEY_ESCAPES)
    return (_key_head(prefix, scope) + key + "}").encode()


def identity_of(prefix: str, name: bytes) -> tuple[str, str] | None:
    """The ``(scope, key)`` of a record's Redis key (``record_key`` read backwards); ``None``
    for a key of another shape under the prefix."""
    text = name.decode("utf-8", "surrogateescape")
    if not text.startswith(prefix + "{") or not text.endswith("}") or ":" not in text:
        return None
    scope, _, key = text[len(prefix) + 1 : -1].partition(":")
    # Only '%' (always escaped), braces and the scope's ':' were escaped: unquote is exact.
    return unquote(scope), unquote(key)


@functools.lru_cache(maxsize=256)
def _key_head(prefix: str, scope: str) -> str:
    return f"{prefix}{{{scope.translate(_SCOPE_ESCAPES)}:"


# Durations are capped at 100 years: deadlines in microseconds must stay integers a Lua double
# holds exactly (below 2**53, about the year 2255), and PEXPIREAT refuses larger ones, so a
# lease_ttl or retention of, say, 1e300 would otherwise fail every reserve.
MAX_DURATION = 100 * 365.25 * 86400


@functools.lru_cache(maxsize=256)  # callers reuse a handful of lease/retention durations
def micros(seconds: float) -> bytes:
    # Bytes, as a script argument goes on the wire: the driver encodes a str on every call.
    return str(max(1, round(min(seconds, MAX_DURATION) * 1_000_000))).encode()


@functools.lru_cache(maxsize=256)
def key_ttl_ms(retention: float, grace_ms: int) -> bytes:
    """The PEXPIRE of a record whose retention deadline is ``micros(retention)`` after the
    script's clock: the grace after it, plus 2 ms for the two clocks' rounding to
    milliseconds, so the key never expires before ``PEXPIREAT ceil(deadline_ms) + grace``."""
    return str(-(-int(micros(retention)) // 1000) + grace_ms + 2).encode()


def seconds(micros: bytes | int) -> float:
    # float(), not int(): a deadline stored in scientific notation (by a version that let
    # deadlines pass 1e17 us) must still read back instead of raising ValueError.
    return float(micros) / 1_000_000


def integer(raw: bytes | int) -> int:
    try:
        return int(raw)
    except ValueError:
        return int(float(raw))


def decode_record(scope: str, key: str, fields: list[Any]) -> Record:
    st, fp, tok, fen, ca, ea, la, res, cp = fields
    status = Status.COMPLETED if st == b"c" else Status.IN_PROGRESS
    return Record(
        scope=scope,
        key=key,
        fingerprint=fp.decode(),
        status=status,
        token=tok.decode(),
        fence=integer(fen),
        response=bytes(res) if status is Status.COMPLETED and res is not None else None,
        created_at=seconds(ca),
        expires_at=seconds(ea),
        lease_expires_at=seconds(la) if status is Status.IN_PROGRESS and la else None,
        checkpoints=decode_checkpoints(cp),
    )
