"""How ``request_fingerprint`` reads form bodies: framing never matters, content always does."""

from __future__ import annotations

import hashlib
from typing import Any

from idemstore import fingerprint
from idemstore.http.request_identity import request_fingerprint


def request(content_type: str, body: bytes) -> str:
    scope: dict[str, Any] = {
        "method": "POST",
        "path": "/upload",
        "query_string": b"",
        "headers": [(b"content-type", content_type.encode("latin-1"))],
    }
    return request_fingerprint(scope, body)


def multipart(boundary: str, *, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    b = boundary.encode()
    return (
        preamble
        + b"--" + b + b"  \r\n"  # transport padding after the delimiter is allowed
        + b'Content-Disposition: form-data; name="caption"\r\n\r\nholiday\r\n'
        + b"--" + b + b"\r\n"
        + b"Content-Disposition: form-data; name=\"photo\"; filename*=utf-8''str%C3%A4nd.png\r\n"
        + b"Content-Type: image/png\r\n\r\n\x89PNG\r\n\x00\xff\r\n"
        + b"--" + b + b"--\r\n"
        + epilogue
    )  # fmt: skip


def test_boundary_preamble_and_epilogue_do_not_matter() -> None:
    first = request("multipart/form-data; boundary=aaa", multipart("aaa"))
    second = request(
        'multipart/form-data; boundary="b-2"',
        multipart("b-2", preamble=b"ignored\r\n", epilogue=b"also ignored"),
    )
    assert first == second


def test_a_changed_byte_in_a_file_changes_the_fingerprint() -> None:
    body = multipart("aaa")
    assert request("multipart/form-data; boundary=aaa", body) != request(
        "multipart/form-data; boundary=aaa", body.replace(b"\x00\xff", b"\x00\xfe")
    )


def test_a_multipart_body_without_its_close_delimiter_is_compared_by_bytes() -> None:
    truncated = multipart("aaa").rsplit(b"--aaa--", 1)[0]
    other_boundary = multipart("bbb").rsplit(b"--bbb--", 1)[0]
    # Not well formed: the bytes decide, so two framings no longer compare equal.
    assert request("multipart/form-data; boundary=aaa", truncated) != request(
        "multipart/form-data; boundary=bbb", other_boundary
    )


def test_json_and_raw_bodies_keep_the_fingerprints_stored_records_have() -> None:
    # Records written before form parsing existed must still match their retries.
    identity = {"method": "POST", "path": "/upload", "query": ""}
    assert request("application/json", b'{"b":[1],"a":1}') == fingerprint(
        {**identity, "body": {"json": {"a": 1, "b": [1.0]}}}
    )
    assert request("text/plain", b"abc") == fingerprint(
        {**identity, "body": {"sha256": hashlib.sha256(b"abc").hexdigest()}}
    )
