"""A recorded JSON-RPC response and its replay, spliced as text: never decoded and re-encoded.

Decoding a result and encoding it again is lossy in Python: ``1e400`` comes back as
``Infinity`` (not JSON), ``-0`` as ``0``, big exponents and duplicate members change. So the
relays record the server's own bytes of the final response and splice the replay together:

- ``recorded(line)``: the response object without its ``jsonrpc`` and ``id`` members, every
  other member as the server wrote it (line breaks between tokens become spaces, so a record
  fits on one stdio line or one SSE ``data`` line; a line break is never inside a JSON string).
- ``replay_line(request_id, stored, marker)``: a whole response line for the retry: its own
  ``id`` first, the recorded members after it, and ``marker: true`` spliced into the
  ``result._meta`` object (added as the result's first member when there is none). An error is
  left as recorded. Records written before (``{"result": ...}``) replay the same way.

``members(text, start)`` finds each member's span with ``json.decoder.scanstring`` and
``JSONDecoder.raw_decode`` (the C scanner), whitespace between tokens allowed. Errors:
``ValueError`` for text that is not one JSON object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Member", "members", "recorded", "replay_line"]

_DECODER = json.JSONDecoder()
# The C string scanner json itself uses (typeshed does not declare it).
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_ENVELOPE = ("jsonrpc", "id")


@dataclass(frozen=True, slots=True)
class Member:
    """One object member: ``text[start:end]`` is ``"name": value`` as written."""

    name: str
    start: int  # the name's opening quote
    value: int  # the value's first character
    end: int  # just past the value


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def members(text: str, start: int) -> tuple[list[Member], int]:
    """The members of the object whose ``{`` is ``text[start]``; and the index past its ``}``."""
    if text[start : start + 1] != "{":
        raise ValueError(f"no object at {start}")
    found: list[Member] = []
    index = _skip(text, start + 1)
    if text[index : index + 1] == "}":
        return found, index + 1
    try:
        while True:
            if text[index : index + 1] != '"':
                raise ValueError(f"expected a member name at {index}")
            name, after = _scanstring(text, index + 1)
            colon = _skip(text, after)
            if text[colon : colon + 1] != ":":
                raise ValueError(f"expected ':' at {colon}")
            value = _skip(text, colon + 1)
            _, end = _DECODER.raw_decode(text, value)
            found.append(Member(name, index, value, end))
            index = _skip(text, end)
            if text[index : index + 1] == "}":
                return found, index + 1
            if text[index : index + 1] != ",":
                raise ValueError(f"expected ',' or '}}' at {index}")
            index = _skip(text, index + 1)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _decode(data: bytes) -> str:
    # As json.loads reads bytes: so whatever the relay parsed, this reads too. A message that
    # opens with "{" and no NUL after it is UTF-8 to json.detect_encoding, told without it.
    encoding = "utf-8" if data[:1] == b"{" and data[1:2] != b"\x00" else json.detect_encoding(data)
    return data.decode(encoding, "surrogatepass")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _top_members(text: str) -> list[Member]:
    found, end = members(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError(f"data after the object at {end}")
    return found


# How nearly every server writes a response: the envelope first, then one "result" or
# "error" member (spacing free). Its record is that one member, found by decoding its value
# alone instead of every member (``recorded``'s cost on each first call through a relay).
_WS = _WHITESPACE.pattern  # JSON's whitespace (\s would take Unicode's as well)
_USUAL = re.compile(
    rf'{_WS}\{{{_WS}"jsonrpc"{_WS}:{_WS}"2\.0"{_WS},{_WS}"id"{_WS}:{_WS}'
    rf'(?:-?(?:0|[1-9][0-9]*)|"[^"\\\x00-\x1f]*"){_WS},{_WS}'  # an int, a plain string
    rf'("(?:result|error)"{_WS}:{_WS})'
)


def _usual_member(text: str) -> str | None:
    """``"result": value`` (or ``"error"``) when it is the only member after the envelope."""
    match = _USUAL.match(text)
    if match is None:
        return None
    try:
        _, end = _DECODER.raw_decode(text, match.end())
    except (ValueError, RecursionError):
        return None  # the slow path says what is wrong
    if text[end:].strip(" \t\n\r") != "}":
        return None  # more members follow (or data after the object): every one is looked at
    return text[match.start(1) : end]


def recorded(line: bytes) -> bytes:
    """A response's record: its members but ``jsonrpc`` and ``id``, as the server wrote them."""
    text = _decode(line)
    usual = _usual_member(text)
    if usual is not None:
        record = "{" + usual + "}"
    else:
        kept = [text[m.start : m.end] for m in _top_members(text) if m.name not in _ENVELOPE]
        record = "{" + ",".join(kept) + "}"
    # Line breaks only occur between tokens (JSON escapes them inside strings).
    return _encode(record).replace(b"\n", b" ").replace(b"\r", b" ")


def replay_line(request_id: bytes, stored: bytes, marker: str) -> bytes:
    """A response line for a retry: its ``request_id`` (JSON), the record, the replay marker."""
    text = _decode(stored)
    found = [m for m in _top_members(text) if m.name not in _ENVELOPE]
    names = {m.name for m in found}
    # The last "result" is the one JSON parsers keep; an answer with an error is not marked.
    result = next((m for m in reversed(found) if m.name == "result"), None)
    if "error" in names:
        result = None
    parts = [b'{"jsonrpc":"2.0","id":', request_id]
    for member in found:
        if member is result:
            piece = text[member.start : member.value] + _marked(text, member, marker)
        else:
            piece = text[member.start : member.end]
        parts += (b",", _encode(piece))
    parts.append(b"}\n")
    return b"".join(parts)


def _last(found: list[Member], name: str) -> Member | None:
    return next((m for m in reversed(found) if m.name == name), None)


def _marked(text: str, result: Member, marker: str) -> str:
    """The result value's text with ``_meta[marker] = true`` spliced in."""
    start, end = result.value, result.end
    if text[start] != "{":
        return text[start:end]  # not an object: nowhere to mark it
    flag = json.dumps(marker) + ":true"
    inner, _ = members(text, start)
    meta = _last(inner, "_meta")
    if meta is None:
        comma = "," if inner else ""
        return '{"_meta":{' + flag + "}" + comma + text[start + 1 : end]
    if text[meta.value] != "{":
        return text[start:end]  # a _meta that is not an object is the server's to keep
    entries, _ = members(text, meta.value)
    existing = _last(entries, marker)
    if existing is not None:
        return text[start : existing.value] + "true" + text[existing.end : end]
    comma = "," if entries else ""
    return text[start : meta.value + 1] + flag + comma + text[meta.value + 1 : end]
