"""The AWS event shapes the Lambda handlers are invoked with, and a Lambda context."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

__all__ = ["Context", "http_v1_event", "http_v2_event", "sqs_event", "sqs_record"]


class Context:
    """A Lambda context whose invocation ends ``remaining_ms`` after it is made."""

    def __init__(self, remaining_ms: int = 30_000) -> None:
        self.deadline = time.monotonic() + remaining_ms / 1000
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = "consumer"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def sqs_record(body: Any, *, message_id: str | None = None, **attributes: str) -> dict[str, Any]:
    text = body if isinstance(body, str) else json.dumps(body)
    return {
        "messageId": message_id or str(uuid.uuid4()),
        "receiptHandle": "AQEB" + uuid.uuid4().hex,
        "body": text,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1765000000000",
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": "1765000000001",
        },
        "messageAttributes": {
            name: {
                "stringValue": value,
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": "String",
            }
            for name, value in attributes.items()
        },
        "md5OfBody": hashlib.md5(text.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "awsRegion": "us-east-1",
    }


def sqs_event(*records: dict[str, Any]) -> dict[str, Any]:
    return {"Records": list(records)}


def http_v2_event(body: Any, *, key: str | None, path: str = "/orders") -> dict[str, Any]:
    """An HTTP API (payload 2.0) or function URL event."""
    headers = {"content-type": "application/json", "host": "abc.lambda-url.us-east-1.on.aws"}
    if key is not None:
        headers["idempotency-key"] = key
    return {
        "version": "2.0",
        "routeKey": f"POST {path}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc",
            "domainName": "abc.lambda-url.us-east-1.on.aws",
            "http": {
                "method": "POST",
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "test",
            },
            "requestId": str(uuid.uuid4()),
            "stage": "$default",
            "timeEpoch": 1765000000000,
        },
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def http_v1_event(body: Any, *, key: str | None, path: str = "/orders") -> dict[str, Any]:
    """A REST API (payload 1.0) proxy event."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return {
        "resource": path,
        "path": path,
        "httpMethod": "POST",
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {"httpMethod": "POST", "path": f"/prod{path}", "stage": "prod"},
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }
