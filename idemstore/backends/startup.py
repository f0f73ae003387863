"""What a door checks once, when it starts, so that a deployment mistake shows at startup
instead of as a duplicate run or a 500 on the first keyed request.

- ``warn_if_process_local``: a store that lives in one process (``memory://``, SQLite
  ``:memory:``) behind a server that says it runs several worker processes (gunicorn's
  ``-w``/``--workers``, also in ``GUNICORN_CMD_ARGS``; uvicorn's and hypercorn's
  ``--workers``; ``WEB_CONCURRENCY``, which gunicorn and uvicorn read as their default) keeps
  one set of records per worker: a retry that lands on another worker runs the key again.
  Logged at WARNING, once per process.
- ``store_ready``: one read, which on an SQL store checks that the schema is migrated (the
  error names the ``?schema=`` it looked in and the migrate command for it) and on DynamoDB
  that the table exists. ``check_at_startup`` runs it for a door: a missing schema raises; an
  engine that cannot be reached yet is logged and left to the requests (it may come up).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import TYPE_CHECKING

from idemstore.errors import SchemaError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "check_at_startup",
    "process_local",
    "server_workers",
    "store_ready",
    "warn_if_process_local",
]

logger = logging.getLogger("idemstore.startup")

# The identity store_ready reads: no door or caller uses the scope (it has a NUL-free name no
# caller rule produces), and reading writes nothing.
_PROBE_SCOPE = "idemstore/startup"
_PROBE_KEY = "readiness-probe"
# Servers whose command line says how many worker processes they fork.
_SERVERS = ("gunicorn", "uvicorn", "hypercorn")
_warned: set[str] = set()


def process_local(store: object) -> bool:
    """Whether ``store`` keeps its records in this process only: its class says
    ``process_local = True`` (the memory store), or it is an SQLite ``:memory:`` database.
    Wrappers (``CachedStore``, ``instrument()``) forward both attributes."""
    return getattr(store, "process_local", False) is True or (
        getattr(store, "database", None) == ":memory:"
    )


def _workers_option(arguments: Sequence[str]) -> int | None:
    for index, argument in enumerate(arguments):
        value = None
        if argument in ("-w", "--workers") and index + 1 < len(arguments):
            value = arguments[index + 1]
        elif argument.startswith("--workers="):
            value = argument.partition("=")[2]
        elif argument.startswith("-w") and argument[2:].isdigit():
            value = argument[2:]
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def server_workers(
    environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> tuple[int, str] | None:
    """How many worker processes the server running this process says it has, and where it
    says so; ``None`` when nothing says (Django's ``runserver``, a plain script: one)."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    program = os.path.basename(argv[0]) if argv else ""
    if any(server in program for server in _SERVERS):
        count = _workers_option(argv[1:])
        if count is not None:
            return count, f"{program} {' '.join(argv[1:])}".strip()
    if "GUNICORN_CMD_ARGS" in environ:
        count = _workers_option(shlex.split(environ["GUNICORN_CMD_ARGS"]))
        if count is not None:
            return count, f"GUNICORN_CMD_ARGS={environ['GUNICORN_CMD_ARGS']!r}"
    concurrency = environ.get("WEB_CONCURRENCY", "").strip()
    if concurrency.isdigit():
        return int(concurrency), f"WEB_CONCURRENCY={concurrency}"
    return None


def warn_if_process_local(
    store: object,
    *,
    door: str,
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> bool:
    """Log a WARNING, once per process and door, when a process-local ``store`` serves a
    server with more than one worker process; return whether it warned."""
    if not process_local(store):
        return False
    workers = server_workers(environ, argv)
    if workers is None or workers[0] < 2 or door in _warned:
        return False
    _warned.add(door)
    logger.warning(
        "the %s door keeps its idempotency records in this process (%s), but %s runs %d"
        " worker processes: each keeps its own records, so a retry that reaches another"
        " worker runs its key again. Use a shared store (sqlite:///FILE on one host,"
        " postgresql://, redis://, dynamodb://) or one worker.",
        door,
        type(store).__name__,
        workers[1],
        workers[0],
    )
    return True


async def store_ready(store: IdempotencyStore) -> None:
    """Raise ``SchemaError`` (schema missing or older than this code, naming the migrate
    command) or ``StoreUnavailableError`` unless ``store`` can serve requests: one read of
    a key no caller uses, which writes nothing."""
    await store.get(_PROBE_KEY, scope=_PROBE_SCOPE)


async def check_at_startup(store: IdempotencyStore, *, door: str) -> bool:
    """A door's startup check: ``store_ready``, a missing schema logged at ERROR and raised,
    an engine that cannot be reached logged at WARNING (requests will find whether it came
    up); ``True`` when the store is ready."""
    try:
        await store_ready(store)
    except SchemaError as exc:
        logger.error("the %s door cannot start: %s", door, exc)
        raise
    except StoreUnavailableError as exc:
        logger.warning("the %s door starts, but its store is not reachable yet: %s", door, exc)
        return False
    return True
