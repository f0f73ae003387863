"""Start real engines from the binaries on PATH, on free loopback ports, in a temporary
directory, and stop them afterwards. The test fixtures and ``idemstore bench --local`` both use
these, so a benchmark runs against exactly what the tests prove.

Each engine module (``redis``, ``postgres``, ``dynamodb``) offers a ``start_*`` function that
returns a running server object with ``.url`` and ``.stop()``; it raises
``ServerUnavailableError`` when the binary is missing or the server does not come up.
"""

from __future__ import annotations

import contextlib
import functools
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "ServerUnavailableError",
    "find_binary",
    "free_port",
    "parse_port_range",
    "ports_from",
    "spawn",
    "wait_for_port",
]


class ServerUnavailableError(RuntimeError):
    """An engine cannot run here: its binary is missing or it failed to start."""


@functools.cache
def _good_ports() -> frozenset[int]:
    import port_for

    return frozenset(port_for.available_good_ports())


# Set by ports_from(): the range free_port() picks from, and the ports it already handed out
# (a server may not have bound its port yet when the next one asks).
_PORTS: range | None = None
_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()


def parse_port_range(text: str) -> range:
    """``"21000-21100"`` as the ports 21000 to 21100; ``ValueError`` saying what is wrong."""
    low, dash, high = text.partition("-")
    if not dash or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"a port range looks like 21000-21100, not {text!r}")
    first, last = int(low), int(high)
    if not 1024 <= first <= last <= 65535:
        raise ValueError(
            f"{text!r} is not a port range: both ends from 1024 to 65535, the first not above"
            " the last"
        )
    return range(first, last + 1)


@contextlib.contextmanager
def ports_from(ports: range | None) -> Iterator[None]:
    """Within the block, ``free_port()`` picks from ``ports`` (``None``: anywhere)."""
    global _PORTS
    with _PORTS_LOCK:
        previous, _PORTS = _PORTS, ports
        _HANDED_OUT.clear()
    try:
        yield
    finally:
        with _PORTS_LOCK:
            _PORTS = previous
            _HANDED_OUT.clear()


def _port_in_range(ports: range) -> int:
    candidates = [port for port in ports if port not in _HANDED_OUT]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
        _HANDED_OUT.add(port)
        return port
    raise ServerUnavailableError(
        f"no free port left in {ports.start}-{ports.stop - 1}: choose a wider --ports range"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (inside ``ports_from``, one
    of its range not handed out yet).

    port-for picks it at random among ports outside the kernel's ephemeral range (and outside
    IANA-assigned ones): a port there cannot be handed to some process's outgoing connection
    between this call and the server's bind, as a port 0 bind (ephemeral) could be. Without
    port-for, the kernel's choice for a port 0 bind.
    """
    with _PORTS_LOCK:
        if _PORTS is not None:
            return _port_in_range(_PORTS)
    try:
        import port_for
    except ImportError:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    chosen: int = port_for.select_random(set(_good_ports()))
    return chosen


def find_binary(name: str, *extra_dirs: str) -> str | None:
    """``name`` on PATH, else in one of ``extra_dirs`` (globs allowed), else ``None``."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in extra_dirs:
        for directory in sorted(Path("/").glob(pattern.lstrip("/")), reverse=True):
            candidate = directory / name
            if candidate.is_file():
                return str(candidate)
    return None


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (a Ctrl-C at the terminal does not reach it), its
    output appended to ``log``."""
    with log.open("ab") as output:
        # The child holds its own copy of the file: ours closes when the server has started.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_port(
    port: int,
    *,
    process: subprocess.Popen[bytes] | None = None,
    timeout: float = 30.0,
    log: Path | None = None,
) -> None:
    """Block until 127.0.0.1:``port`` accepts connections; raise with the log tail if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + log.read_text(errors="replace")[-2000:]
    if process is not None and process.poll() is not None:
        raise ServerUnavailableError(
            f"the server for 127.0.0.1:{port} exited with status {process.returncode}{tail}"
        )
    raise ServerUnavailableError(f"nothing listened on 127.0.0.1:{port} within {timeout}s{tail}")
