"""``idemstore proxy`` as a command: options, errors before the relay starts, signals, stdio."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.mcp.raw import ENV, mock_command, proxy_command

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]


def _run(command: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {name: value for name, value in ENV.items() if name != "REDIS_URL"}
    return subprocess.run(command, input=stdin, capture_output=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("options", "server", "message"),
    [
        ([], ["/nonexistent/server"], b"cannot start the MCP server"),
        (["--store", "redis"], None, b"--store redis needs --redis-url URL (or $REDIS_URL)"),
        (["--redis-url", "redis://127.0.0.1:1"], None, b"--redis-url goes with --store redis"),
        (["--retention", "5", "--ttl-ms", "5000"], None, b"not both"),
        (["--store", "nosuch://x"], None, b"unknown store scheme"),
    ],
)
def test_a_bad_option_is_one_line_on_stderr_and_exit_two(
    options: list[str], server: list[str] | None, message: bytes
) -> None:
    done = _run(proxy_command(*options, server=server or mock_command()))
    assert done.returncode == 2
    assert done.stdout == b""
    assert done.stderr.startswith(b"idemstore: error: ") and message in done.stderr
    assert done.stderr.count(b"\n") == 1


def test_no_server_command_is_an_error() -> None:
    done = _run(proxy_command(server=[])[:-1])
    assert done.returncode == 2
    assert b"no server command" in done.stderr


def test_mcp_idempotent_flags_are_accepted(counter: Path) -> None:
    request = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    command = proxy_command("--store", "memory", "--ttl-ms", "600000", server=mock_command())
    done = _run(command, request)
    assert done.returncode == 0
    assert done.stdout == b'{"jsonrpc": "2.0", "id": 1, "result": {}}\n'


def test_stdout_carries_only_protocol_messages_even_when_logging(counter: Path) -> None:
    calls = b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"charge",'
        b'"arguments":{"amount":1}}}\n' % i
        for i in (1, 2)
    )
    server = mock_command("--counter", str(counter))
    done = _run(proxy_command("--log-level", "debug", server=server), calls)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 2
    assert b"replayed derived key" in done.stderr


def test_stdin_that_is_not_a_pipe_works(tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    with requests.open("rb") as stdin:
        done = subprocess.run(
            proxy_command(server=mock_command()), stdin=stdin, capture_output=True, env=ENV
        )
    assert done.returncode == 0 and done.stdout.endswith(b'"result": {}}\n')
    done = subprocess.run(
        proxy_command(server=mock_command()), stdin=subprocess.DEVNULL, env=ENV, timeout=60
    )
    assert done.returncode == 0


async def test_sigterm_is_passed_to_the_server_and_its_status_returned(spawn: Spawn) -> None:
    proxy = await spawn(proxy_command(server=mock_command()))
    assert await proxy.request(1, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
    proxy.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proxy.process.wait(), 20) == 128 + signal.SIGTERM
