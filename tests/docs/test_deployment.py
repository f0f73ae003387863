"""docs/deployment.md, run: two gateway replicas started with the page's command and its TOML
file, on one Redis, in front of one upstream; each prints the page's startup line and answers
the page's `/healthz` and `/readyz` requests as the page says.

Placeholders filled here: the replicas' listen addresses (loopback ports), the upstream (a
stub HTTP server), the store (the test Redis), the config file's path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.backends.urls import redact_url
from idemstore.local_servers import ServerUnavailableError, free_port, wait_for_port
from tests.docs.markdown_blocks import ROOT, Block, blocks_of
from tests.loopback_process import stop_process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PAGE = ROOT / "docs" / "deployment.md"
PAGE_LISTEN = "0.0.0.0:8080"
PAGE_UPSTREAM = "http://mcp-server.internal:9000/mcp"
PAGE_CONFIG = "/etc/idemstore/gateway.toml"


def page_block(lang: str) -> Block:
    (block,) = (b for b in blocks_of(PAGE) if b.lang == lang and b.marker == "tested-by")
    return block


def shell_block(containing: str) -> Block:
    (block,) = (b for b in blocks_of(PAGE) if b.lang == "bash" and containing in b.source)
    return block


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()


def start_replica(
    tmp_path: Path, name: str, store_url: str, upstream: str
) -> tuple[subprocess.Popen[str], str, str]:
    """One replica started by the page's command; its process, listen address, startup line."""
    listen = f"127.0.0.1:{free_port()}"
    config = tmp_path / f"{name}.toml"
    config.write_text(
        page_block("toml").source.replace(PAGE_LISTEN, listen).replace(PAGE_UPSTREAM, upstream)
    )
    command = shell_block("idemstore gateway --config").source
    command = command.replace(PAGE_CONFIG, str(config))
    command = re.sub(
        r"IDEMSTORE_GATEWAY_STORE='[^']*'", f"IDEMSTORE_GATEWAY_STORE='{store_url}'", command
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "idemstore"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m idemstore "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        ["bash", "-c", command.strip()],  # one simple command: bash execs it
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    first_line = process.stderr.readline().rstrip("\n")
    # the rest of its logs must not fill the pipe
    threading.Thread(target=process.stderr.read, daemon=True).start()
    try:
        wait_for_port(int(listen.rsplit(":", 1)[1]), process=process, timeout=30)
    except ServerUnavailableError as exc:
        process.kill()
        pytest.fail(f"replica {name} did not start: {exc}; it said {first_line!r}")
    return process, listen, first_line


@pytest.fixture(scope="module")
def store_url(redis_server_url: str) -> str:
    """The test Redis, under a key prefix of this module's (both replicas share it)."""
    separator = "&" if "?" in redis_server_url else "?"
    return f"{redis_server_url}{separator}prefix=docs-deployment-{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, store_url: str, upstream: str
) -> Iterator[list[tuple[str, str]]]:
    """Both replicas, started once for this module's tests (each start costs seconds)."""
    tmp_path = tmp_path_factory.mktemp("deployment")
    started = []
    try:
        for name in ("gateway-1", "gateway-2"):
            started.append(start_replica(tmp_path, name, store_url, upstream))
        yield [(listen, line) for _, listen, line in started]
    finally:
        for process, _, _ in started:
            stop_process(process, timeout=10)


def test_both_replicas_print_the_pages_startup_line(
    replicas: list[tuple[str, str]], store_url: str, upstream: str
) -> None:
    page_line = page_block("text").source.strip()
    page_store = re.search(r"; store (\S+);", page_line)
    assert page_store, page_line
    for listen, line in replicas:
        expected = (
            page_line.replace(PAGE_LISTEN, listen)
            .replace(PAGE_UPSTREAM, upstream)
            .replace(page_store[1], redact_url(store_url))
        )
        assert line == expected


def test_both_replicas_answer_the_pages_probes(replicas: list[tuple[str, str]]) -> None:
    probes = shell_block("/healthz").source
    for listen, _ in replicas:
        for line in probes.strip().splitlines():
            command, _, answer = line.partition("#")
            command = command.replace("gateway-1.internal:8080", listen)
            done = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=30, check=True
            )
            assert done.stdout.strip() == answer.strip(), command
