"""The local DynamoDB endpoint (moto behind one lock) keeps connections, as DynamoDB does."""

from __future__ import annotations

import http.client
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from idemstore.local_servers.dynamodb import start_dynamodb

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

HEADERS = {
    "X-Amz-Target": "DynamoDB_20120810.ListTables",
    "Content-Type": "application/x-amz-json-1.0",
    "Authorization": (
        "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host, Signature=0"
    ),
}


def test_requests_in_a_row_are_answered_on_one_connection(tmp_path: Path) -> None:
    server = start_dynamodb(tmp_path)
    try:
        where = urlsplit(server.url)
        assert where.hostname is not None
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=5)
        sockets = []
        for _ in range(3):
            # A body each time: the next request must start right after it, unread or not.
            connection.request("POST", "/", body=b'{"Limit": 10}', headers=HEADERS)
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, body
            assert json.loads(body) == {"TableNames": []}
            assert response.getheader("Connection") != "close"
            sockets.append(connection.sock)
        connection.close()
    finally:
        server.stop()
    assert sockets[0] is not None and sockets.count(sockets[0]) == 3
