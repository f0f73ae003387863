"""``idemstore bench --local``: start a server on loopback for every engine that has a launcher.

An engine's launcher is its registry entry's ``launcher`` (``idemstore.backends.registry``); the
built-in ones below start Redis, PostgreSQL and a DynamoDB endpoint.

The engines are started by the same ``idemstore.local_servers`` functions the test fixtures
use, so the benchmark measures exactly what the tests prove. A launcher that is missing (not
importable) or whose binary is missing (``ServerUnavailableError``) makes that backend
unavailable in the report; it never stops the run.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.backends.registry import engines
from idemstore.bench.results import Unavailable
from idemstore.local_servers import ServerUnavailableError, ports_from

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

__all__ = [
    "Launcher",
    "LocalServer",
    "registered_launchers",
    "start_local_servers",
    "stop_local_servers",
]


# The extra that brings what the launchers need besides the engines' binaries.
LOCAL_EXTRA = "local"


@dataclass(frozen=True, slots=True)
class Launcher:
    """Where a backend's server starter lives: ``module.function(tmpdir)`` (or ``function()``
    when ``takes_dir`` is false) returns an object with ``.url`` and ``.stop()``."""

    backend: str
    module: str
    function: str
    takes_dir: bool = True


@dataclass(frozen=True, slots=True)
class _Started:
    """A started engine as the bench needs it: the store URL on it and how to stop it."""

    url: str
    server: Any

    def stop(self) -> None:
        self.server.stop()


def start_redis_for_bench(where: Path) -> _Started:
    from idemstore.local_servers.redis import start_redis

    server = start_redis(directory=where)
    return _Started(server.url, server)


def start_dynamodb_for_bench(where: Path) -> _Started:
    import os

    from idemstore.local_servers.dynamodb import start_dynamodb

    # moto accepts any credentials; the SDK still wants some before it signs a request.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    server = start_dynamodb(where)
    return _Started(
        f"dynamodb://idemstore_bench?region=us-east-1&auto_create=true&endpoint_url={server.url}",
        server,
    )


def start_postgres_for_bench(where: Path) -> _Started:
    from idemstore.local_servers.postgres import start_postgres

    server = start_postgres()
    return _Started(server.url, server)


def registered_launchers() -> tuple[Launcher, ...]:
    """A launcher for every registered engine that declares one, in registry order."""
    launchers = []
    for engine in engines():
        if engine.launcher is not None:
            module, _, function = engine.launcher.partition(":")
            launchers.append(Launcher(engine.name, module, function))
    return tuple(launchers)


@dataclass(frozen=True, slots=True)
class LocalServer:
    """A running server: its backend name, store URL, and the launcher's object to stop."""

    backend: str
    url: str
    handle: Any

    @property
    def version(self) -> str | None:
        version = getattr(self.handle, "version", None)
        return None if version is None else str(version)


def start_local_servers(
    tmpdir: Path, launchers: Sequence[Launcher] | None = None, *, ports: range | None = None
) -> tuple[list[LocalServer], list[Unavailable]]:
    """Start every launcher's server (by default, every registered engine's), on ports from
    ``ports`` when given; return those running and those that could not run.

    Blocking (launchers wait for their port): call it from a thread inside an event loop.
    """
    if launchers is None:
        launchers = registered_launchers()
    running: list[LocalServer] = []
    missing: list[Unavailable] = []
    with ports_from(ports):
        for launcher in launchers:
            started = _start(launcher, tmpdir)
            if isinstance(started, Unavailable):
                missing.append(started)
            else:
                running.append(started)
    return running, missing


def _start(launcher: Launcher, tmpdir: Path) -> LocalServer | Unavailable:
    try:
        module = importlib.import_module(launcher.module)
        start = getattr(module, launcher.function)
    except (ImportError, AttributeError) as exc:
        return Unavailable(
            launcher.backend,
            f"no launcher {launcher.module}.{launcher.function} in this version ({exc})",
        )
    try:
        if launcher.takes_dir:
            where = tmpdir / launcher.backend
            where.mkdir(parents=True, exist_ok=True)
            handle = start(where)
        else:
            handle = start()
    except ServerUnavailableError as exc:
        # A Python package the launcher needs (moto, mirakuru) comes with one extra.
        extra = LOCAL_EXTRA if isinstance(exc.__cause__, ImportError) else None
        return Unavailable(launcher.backend, f"server unavailable: {exc}", extra=extra)
    except Exception as exc:  # a launcher bug must not cost the other backends their run
        return Unavailable(launcher.backend, f"server failed to start: {type(exc).__name__}: {exc}")
    return LocalServer(launcher.backend, str(handle.url), handle)


def stop_local_servers(servers: Sequence[LocalServer]) -> None:
    """Stop every server, the last started first; a failing stop does not skip the others."""
    for server in reversed(servers):
        with contextlib.suppress(Exception):
            server.handle.stop()
