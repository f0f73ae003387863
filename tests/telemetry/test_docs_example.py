"""The observability page's example app, run as written: metrics scraped by HTTP, traces
received over OTLP, both on loopback, the store a real Redis."""

from __future__ import annotations

import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from idemstore.local_servers import free_port
from tests.conftest import ROOT
from tests.loopback_process import Child

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PAGE = ROOT / "docs" / "observability.md"


def _example_app() -> str:
    text = PAGE.read_text()
    found = re.search(r"`app\.py`:\n\n(?:<!-- [^\n]* -->\n)?```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/observability.md lost its app.py example"
    return found.group(1)


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[bytes]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[int, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (_Receiver,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], bodies
    finally:
        server.shutdown()
        server.server_close()


def _spans(bodies: list[bytes]) -> list[Any]:
    spans = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
    return spans


def _attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values


@pytest.mark.slow
def test_the_documented_app_exports_metrics_and_traces(
    redis_store_url: str, otlp_receiver: tuple[int, list[bytes]], tmp_path: Path
) -> None:
    otlp_port, bodies = otlp_receiver
    metrics_port, app_port = free_port(), free_port()
    code = _example_app()
    for documented, actual in (
        ("redis://127.0.0.1:6379/0", redis_store_url),
        ("9464", str(metrics_port)),
        ("127.0.0.1:4318", f"127.0.0.1:{otlp_port}"),
    ):
        assert documented in code
        code = code.replace(documented, actual)
    (tmp_path / "app.py").write_text(code)
    argv = [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1"]
    argv += ["--port", str(app_port)]
    # Stopped as a service manager stops it (SIGTERM): the app's lifespan flushes the
    # batched spans before it exits.
    app = Child(argv, app_port, tmp_path / "uvicorn.log", cwd=tmp_path, stop_timeout=30)
    with app:
        base = f"http://127.0.0.1:{app_port}"
        key = {"Idempotency-Key": "o-1"}
        first = httpx.post(f"{base}/orders", json={"sku": "A1"}, headers=key)
        again = httpx.post(f"{base}/orders", json={"sku": "A1"}, headers=key)
        other = httpx.post(f"{base}/orders", json={"sku": "B2"}, headers=key)
        assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
        assert again.headers["idempotent-replayed"] == "true"

        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        calls = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^idemstore_consumer_calls_total\{.*?idemstore_call_outcome="(\w+)".*\} (\S+)$',
                scraped,
                re.MULTILINE,
            )
        }
        assert calls == {"executed": 1.0, "replayed": 1.0, "conflict": 1.0}

    spans = _spans(bodies)
    by_id = {span.span_id: span for span in spans}
    replays = [
        s
        for s in spans
        if s.name == "idemstore asgi" and _attributes(s).get("idemstore.call.outcome") == "replayed"
    ]
    assert len(replays) == 1
    children = [s for s in spans if s.parent_span_id == replays[0].span_id]
    assert [(c.name, _attributes(c)["idemstore.outcome"]) for c in children] == [
        ("idemstore reserve", "completed")
    ]
    assert all(s.parent_span_id in by_id or not s.parent_span_id for s in spans)
    for span in spans:
        for value in _attributes(span).values():
            assert "o-1" not in str(value) and "A1" not in str(value)
