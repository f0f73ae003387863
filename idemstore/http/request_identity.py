"""What identifies an HTTP request for idempotency: its key and its fingerprint.

Shared by every HTTP door (the ASGI middleware, and the doors that run it): the
``Idempotency-Key`` field (draft-ietf-httpapi-idempotency-key-header, an RFC 8941 sf-string or
a bare token) and ``request_fingerprint``, which compares bodies by what they say rather than
how they are framed (the caller is ``idemstore.http.callers``'):

- JSON (``application/json``, ``*+json``): the parsed value, canonical (key order,
  whitespace, escapes and ``1`` vs ``1.0`` make no difference);
- ``application/x-www-form-urlencoded``: the sequence of (name, value) pairs after
  percent-decoding (``+`` vs ``%20``, ``%41`` vs ``A`` make no difference; order does);
- ``multipart/form-data``: the sequence of parts, each by field name, filename, content type
  and a SHA-256 of its bytes; the boundary (which clients pick anew per request), preamble,
  epilogue and other part headers make no difference;
- anything else, or a body that does not parse as its type says: the SHA-256 of its bytes.

The method, path and query string are part of the fingerprint too; other headers are not,
unless named (``headers``). A ``FieldSelection`` (``idemstore.fingerprint_fields``) narrows
what of a JSON body counts; it does not apply to other bodies, which count whole.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import MutableMapping
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from idemstore.errors import CanonicalizationError
from idemstore.hashing import fingerprint

if TYPE_CHECKING:
    from idemstore.fingerprint_fields import FieldSelection

__all__ = [
    "header_values",
    "parse_idempotency_key",
    "request_fingerprint",
]

Scope = MutableMapping[str, Any]

# RFC 8941 sf-string: printable ASCII, with only \" and \\ escaped.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
# A bare value: RFC 8941 token characters, but a leading digit is allowed too, because
# clients commonly send bare UUIDs.
_BARE = re.compile(r"[A-Za-z0-9*!#$%&'+\-.^_`|~:/]+")
# Parameters after an sf-item (";a=1"); accepted and ignored.
_PARAMS = re.compile(r"(?:;\s*[a-z*][a-z0-9_\-.*]*(?:=[^;]*)?)*")


def parse_idempotency_key(value: str) -> str:
    """The key in an ``Idempotency-Key`` field value: an sf-string, or a bare token.

    Raises ``ValueError`` saying what is wrong with ``value``.
    """
    text = value.strip(" \t")
    match = _SF_STRING.match(text)
    if match is not None:
        rest = text[match.end() :]
        if _PARAMS.fullmatch(rest) is None:
            raise ValueError("unexpected characters after the quoted key")
        return re.sub(r"\\(.)", r"\1", match.group(1))
    if text.startswith('"'):
        raise ValueError(
            "the quoted key is not a valid structured-field string (unterminated, or a"
            " character outside printable ASCII, or a backslash before something other than"
            ' " or \\)'
        )
    bare, _, params = text.partition(";")
    if not bare or _BARE.fullmatch(bare) is None:
        raise ValueError(
            'the key must be a quoted string such as "8e03978e-40d5-43e8-bc93-6894a57f9324"'
            " (RFC 8941) or a bare token"
        )
    if params and _PARAMS.fullmatch(";" + params) is None:
        raise ValueError("unexpected characters after the key")
    return bare


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """The values of header ``name`` (lower case) in an ASGI scope, in order."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def request_fingerprint(
    scope: Scope,
    body: bytes,
    *,
    fields: FieldSelection | None = None,
    headers: tuple[bytes, ...] = (),
) -> str:
    """The fingerprint of a request: method, path, query and body as the module says, the
    JSON body narrowed by ``fields``, and the values of the ``headers`` named (lower case).
    """
    request: dict[str, Any] = {
        "method": scope.get("method", "").upper(),
        "path": scope.get("path", ""),
        "query": scope.get("query_string", b"").decode("latin-1"),
    }
    if headers:
        # Only when asked: the fingerprints records already hold stay as they were.
        request["headers"] = {
            name.decode("latin-1"): [v.decode("latin-1") for v in header_values(scope, name)]
            for name in headers
        }
    content_types = header_values(scope, b"content-type")
    try:
        parsed = _parsed_body(content_types, body)
        if fields is not None and "json" in parsed:
            parsed = {"json": fields.apply(parsed["json"])}
        return fingerprint({**request, "body": parsed})
    except (CanonicalizationError, RecursionError):
        # A JSON body holding NaN, or nested too deep: compare its bytes instead.
        return fingerprint({**request, "body": _raw_body(body)})


def _raw_body(body: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(body).hexdigest()}


def _parsed_body(content_types: list[bytes], body: bytes) -> dict[str, Any]:
    raw = _raw_body(body)
    if not body or len(content_types) != 1:
        return raw
    header = Message()
    header["content-type"] = content_types[0].decode("latin-1")
    media = header.get_content_type()
    try:
        if media == "application/json" or media.endswith("+json"):
            return {"json": json.loads(body)}
        if media == "application/x-www-form-urlencoded":
            # latin-1 maps every byte to one character: percent-decoding stays lossless.
            text = body.decode("latin-1")
            pairs = parse_qsl(text, keep_blank_values=True, encoding="latin-1")
            return {"form": [[name, value] for name, value in pairs]}
        if media == "multipart/form-data":
            boundary = _param(header, "boundary", "content-type")
            parts = _multipart_parts(body, boundary.encode("latin-1")) if boundary else None
            if parts is not None:
                return {"multipart": parts}
    except (ValueError, RecursionError):
        pass
    return raw


def _param(header: Message, name: str, field: str) -> str | None:
    value = header.get_param(name, header=field)
    if value is None or isinstance(value, str):
        return value
    return collapse_rfc2231_value(value)


def _multipart_parts(body: bytes, boundary: bytes) -> list[dict[str, Any]] | None:
    """Each part of a multipart/form-data body, or ``None`` when it is not well formed.

    Works on offsets into ``body`` (each part's bytes are hashed through a memoryview), so
    the only memory it adds is the part headers.
    """
    delimiter = b"--" + boundary
    separator = b"\r\n" + delimiter
    if body.startswith(delimiter):
        position = len(delimiter)
    else:  # a preamble, then the first delimiter on a line of its own
        found = body.find(separator)
        if found < 0:
            return None
        position = found + len(separator)
    view = memoryview(body)
    parts: list[dict[str, Any]] = []
    while True:
        if body.startswith(b"--", position):
            return parts  # the close delimiter; the epilogue is ignored
        line_end = body.find(b"\r\n", position)
        if line_end < 0 or body[position:line_end].strip(b" \t"):
            return None  # only transport padding may follow a delimiter on its line
        start = line_end + 2
        end = body.find(separator, start)
        if end < 0:
            return None
        if body.startswith(b"\r\n", start):  # a part without headers
            head_end, content_start = start, start + 2
        else:
            head_end = body.find(b"\r\n\r\n", start, end)
            if head_end < 0:
                return None
            content_start = head_end + 4
        part = _part_identity(body[start:head_end], view[content_start:end])
        if part is None:
            return None
        parts.append(part)
        position = end + len(separator)


def _part_identity(head: bytes, content: memoryview) -> dict[str, Any] | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head.decode("latin-1")
    fields = Message()
    for line in text.split("\r\n") if text else ():
        name, colon, value = line.partition(":")
        if not colon:
            return None
        fields[name.strip()] = value.strip()
    disposition = fields.get("content-disposition")
    if disposition is None or fields.get_content_disposition() != "form-data":
        return None
    content_type = fields.get("content-type")
    return {
        "name": _param(fields, "name", "content-disposition"),
        "filename": _param(fields, "filename", "content-disposition"),
        "type": None if content_type is None else str(content_type).strip(),
        "sha256": hashlib.sha256(content).hexdigest(),
    }
