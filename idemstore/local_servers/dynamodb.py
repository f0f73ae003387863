"""A DynamoDB-compatible endpoint on a free loopback port: moto's server, in a child process.

moto's own server answers requests on several threads and checks a ``ConditionExpression``
and applies the write as two separate steps with no lock between them, so two concurrent
conditional writes to one item can both succeed there. Real DynamoDB applies each
single-item write atomically, and idemstore's correctness rests on that. This module
therefore serves moto's WSGI application behind a lock (one request at a time, keep-alive
connections on threads), which gives the endpoint DynamoDB's per-item atomicity.

Werkzeug's server closes every connection after one response (and drains the socket after
it, which would swallow a kept connection's next request), so each request would pay a new
TCP connection, which an SDK's pool never pays against DynamoDB. The handler here reads each
request's body whole, answers with a ``Content-Length`` and keeps the connection.

Run as ``python -m idemstore.local_servers.dynamodb --port N`` to serve in the foreground.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.install_lines import install_hint
from idemstore.local_servers import ServerUnavailableError, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["DynamoDBServer", "serve", "start_dynamodb"]


@dataclass(slots=True)
class DynamoDBServer:
    """A running moto server: ``url`` is its endpoint (``http://127.0.0.1:PORT``).

    ``executor`` is the mirakuru executor that started it (the process is in a session of its
    own, so ``stop`` ends it and anything it started).
    """

    url: str
    executor: Any
    log: Path

    @property
    def process(self) -> subprocess.Popen[str] | None:
        process: subprocess.Popen[str] | None = self.executor.process
        return process

    def stop(self) -> None:
        """Stop the server and wait for it to exit (idempotent)."""
        from mirakuru.exceptions import ExecutorError

        # An exit code other than SIGTERM's at teardown is nothing a caller can act on.
        with contextlib.suppress(ProcessLookupError, ExecutorError):
            self.executor.stop()


def start_dynamodb(directory: Path | None = None, *, attempts: int = 3) -> DynamoDBServer:
    """Start moto's server on a free loopback port; ``ServerUnavailableError`` if it cannot.

    mirakuru runs the child and waits until its port accepts connections (or the child dies,
    or 30 s pass); what is ours is the server it runs (``serve``: moto behind one lock).
    """
    try:
        import moto.server  # noqa: F401
        from mirakuru import TCPExecutor
        from mirakuru.exceptions import ExecutorError
    except ImportError as exc:
        raise ServerUnavailableError(
            f"{exc.name} is not installed: {install_hint('local')}"
        ) from exc
    where = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="moto-"))
    last: ServerUnavailableError | None = None
    for _ in range(attempts):
        # Another process may take the free port before the child binds it: try again.
        port = free_port()
        log = where / f"moto-{port}.log"
        with log.open("wb") as out:
            executor = TCPExecutor(
                [sys.executable, "-m", "idemstore.local_servers.dynamodb", "--port", str(port)],
                host="127.0.0.1",
                port=port,
                timeout=30,
                envvars={"PYTHONPATH": _package_root()},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                executor.start()
            except ExecutorError as exc:
                with contextlib.suppress(Exception):
                    executor.stop()
                tail = log.read_text(errors="replace")[-2000:]
                last = ServerUnavailableError(f"moto did not start on port {port}: {exc}\n{tail}")
                continue
        return DynamoDBServer(f"http://127.0.0.1:{port}", executor, log)
    assert last is not None
    raise last


def _package_root() -> str:
    root = str(Path(__file__).resolve().parent.parent.parent)
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


class _OneRequestAtATime:
    """WSGI middleware: run the wrapped application for one request at a time."""

    __slots__ = ("_app", "_lock")

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            # Drain the body inside the lock: moto builds it while it touches its state.
            return list(self._app(environ, start_response))


def _request_body(environ: dict[str, Any]) -> bytes:
    """The request's whole body, so the connection's next request starts right after it."""
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):
        return bytes(stream.read())  # chunked: read to its end
    length = environ.get("CONTENT_LENGTH")
    return bytes(stream.read(int(length))) if length else b""


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve moto's DynamoDB (and the rest of moto) on ``host:port`` until interrupted."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class KeepAliveHandler(MotoRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without this, the body would wait for the
        # client's delayed ACK of the headers (40 ms on Linux) on a kept connection.
        disable_nagle_algorithm = True

        # One log line per request would grow the log by megabytes in a test session.
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run_wsgi(self) -> None:
            environ = self.make_environ()
            environ["wsgi.input"] = io.BytesIO(_request_body(environ))
            answer: list[Any] = []

            def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> Any:
                answer[:] = [status, headers]
                return None

            try:
                body = b"".join(self.server.app(environ, start_response))
            except Exception:
                self.log_error("moto failed a request:\n%s", traceback.format_exc())
                answer[:] = ["500 Internal Server Error", []]
                body = b""
                self.close_connection = True
            status, headers = answer
            code, _, reason = status.partition(" ")
            self.send_response(int(code), reason)
            for name, value in headers:
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if environ["REQUEST_METHOD"] != "HEAD":
                self.wfile.write(body)

    app = _OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server(host, port, app, threaded=True, request_handler=KeepAliveHandler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    # terminate() sends SIGTERM: leave serve_forever cleanly instead of dying mid-request.
    signal.signal(signal.SIGTERM, _interrupt)
    serve(args.port)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
