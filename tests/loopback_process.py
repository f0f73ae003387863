"""A test's own server process on a loopback port: started, waited for, stopped.

The gateway suite's upstream and gateway replicas, the HTTP suite's uvicorn and the
observability page's example app all run this way, with this checkout on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemstore.local_servers import ServerUnavailableError, wait_for_port

if TYPE_CHECKING:
    from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
START_TIMEOUT = 30.0

__all__ = ["ENV", "ROOT", "Child", "stop_process"]


def stop_process(process: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM ``process`` unless it already exited; SIGKILL it if it takes longer than
    ``timeout`` seconds to exit."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Child:
    """A process started from ``argv`` that serves on 127.0.0.1:``port``; its output goes to
    ``log``; ``env`` adds to ``ENV``. ``stop_timeout``: how long a SIGTERM may take (a lifespan
    that flushes) before SIGKILL. As a context manager: started on entry, stopped on exit."""

    argv: list[str]
    port: int
    log: Path
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)
    stop_timeout: float = 10.0
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> Child:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                env={**ENV, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
            )
        self.wait_listening()
        return self

    def wait_listening(self) -> None:
        """Return once the port accepts connections; fail the test with the process's output
        if it exits first or does not listen within ``START_TIMEOUT``."""
        try:
            wait_for_port(self.port, process=self.process, timeout=START_TIMEOUT, log=self.log)
        except ServerUnavailableError as exc:
            self.kill()
            raise AssertionError(f"{self.argv} did not serve: {exc}") from exc

    def stop(self) -> None:
        stop_process(self.process, self.stop_timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
