"""docs/http.md's example: examples/http_payments.py under uvicorn, sent the page's own curl
commands, each answering what the page shows (a first run, a replay, a conflict, a request in
progress, a caller-less key)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from idemstore.local_servers import free_port
from tests.docs.markdown_blocks import ROOT, Block, blocks_of
from tests.docs.test_code_blocks import matches_page
from tests.loopback_process import Child

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PAGE = ROOT / "docs" / "http.md"
# Long enough that the page's retry surely arrives while the first request still runs.
PAYMENT_SECONDS = "2"


def curl_block() -> Block:
    (block,) = (b for b in blocks_of(PAGE) if b.lang == "console" and "$ curl" in b.source)
    return block


def steps(block: Block) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for line in block.source.rstrip("\n").splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        else:
            found[-1][1].append(line)
    return found


def started_on_the_server(store: Path, key: str) -> bool:
    """The request under ``key`` holds its key: a retry sent now finds it in progress."""
    if not store.exists():
        return False
    with sqlite3.connect(store) as db:
        try:
            row = db.execute("SELECT 1 FROM idemstore_records WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:  # the table is not there yet
            return False
    return row is not None


@pytest.fixture
def payments_port(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = {
        "IDEMSTORE_URL": f"sqlite:///{tmp_path / 'payments-idem.db'}",
        "PAYMENT_SECONDS": PAYMENT_SECONDS,
    }
    argv = [sys.executable, "-m", "uvicorn", "examples.http_payments:app", "--port", str(port)]
    with Child(argv, port, tmp_path / "uvicorn.log", env=env):
        yield port


def test_the_pages_curl_commands_get_the_answers_it_shows(
    payments_port: int, tmp_path: Path
) -> None:
    store = tmp_path / "payments-idem.db"
    background: list[subprocess.Popen[bytes]] = []
    try:
        for command, shown in steps(curl_block()):
            command = command.replace("localhost:8000", f"127.0.0.1:{payments_port}")
            if " & " in command:
                # The page starts a slow request and sleeps a moment; the test waits instead
                # until that request holds its key, so the retry is in progress on any machine.
                first, _ = command.split(" & ", 1)
                key = first.split('Idempotency-Key: "', 1)[1].split('"', 1)[0]
                background.append(subprocess.Popen(["bash", "-c", first]))
                deadline = time.monotonic() + 30
                while not started_on_the_server(store, key):
                    assert time.monotonic() < deadline, f"{key} never reached the server"
                    time.sleep(0.02)
                continue
            done = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=30, check=True
            )
            printed = done.stdout.replace("\r\n", "\n").rstrip("\n").splitlines()
            assert matches_page(shown, printed), f"`{command}` printed\n{done.stdout}"
    finally:
        for process in background:
            process.wait(timeout=30)
