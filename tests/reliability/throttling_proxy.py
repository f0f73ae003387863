"""An HTTP proxy on loopback that throttles a DynamoDB endpoint the way DynamoDB does.

Point a store's ``endpoint_url`` at ``proxy.url``. Each request is forwarded to the real
endpoint, except that with probability ``rate`` (switchable at any moment from any thread) it
is answered at once with HTTP 400 and ``ProvisionedThroughputExceededException`` or
``ThrottlingException``, without reaching the endpoint: a throttled request did nothing, which
is what the SDK's retries rely on. Built on the standard library's WSGI server and HTTP
client, a thread per connection (an idle keep-alive connection must not hold up the others).
"""

from __future__ import annotations

import http.client
import json
import random
import socketserver
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import TracebackType

__all__ = ["THROTTLE_CODES", "ThrottlingProxy"]

THROTTLE_CODES = ("ProvisionedThroughputExceededException", "ThrottlingException")
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class ThrottlingProxy:
    """``127.0.0.1:port`` in front of ``target`` (an ``http://host:port`` endpoint)."""

    def __init__(self, target: str, *, seed: int = 0) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rate = 0.0
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the proxy first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> Self:
        self._server = make_server(
            "127.0.0.1", 0, self._app, server_class=_ThreadingServer, handler_class=_Quiet
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="throttling-proxy", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        with self._lock:
            self.counts["requests"] += 1
            throttle = self._rng.random() < self.rate
            code = self._rng.choice(THROTTLE_CODES)
            if throttle:
                self.counts["throttled requests"] += 1
        if throttle:
            payload = json.dumps(
                {
                    "__type": f"com.amazonaws.dynamodb.v20120810#{code}",
                    "message": "The level of configured provisioned throughput was exceeded",
                }
            ).encode()
            start_response(
                "400 Bad Request",
                [
                    ("Content-Type", "application/x-amz-json-1.0"),
                    ("x-amzn-ErrorType", f"{code}:"),
                    ("Content-Length", str(len(payload))),
                ],
            )
            return [payload]
        headers = {
            name[5:].replace("_", "-").title(): value
            for name, value in environ.items()
            if name.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        headers["Content-Length"] = str(len(body))
        headers.pop("Connection", None)
        path = environ.get("PATH_INFO") or "/"
        if environ.get("QUERY_STRING"):
            path += "?" + environ["QUERY_STRING"]
        connection = http.client.HTTPConnection(*self._target, timeout=30)
        try:
            connection.request(environ["REQUEST_METHOD"], path, body=body, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
            forwarded = [
                (name, value)
                for name, value in reply.getheaders()
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length"
            ]
            forwarded.append(("Content-Length", str(len(data))))
            start_response(f"{reply.status} {reply.reason}", forwarded)
            return [data]
        finally:
            connection.close()
