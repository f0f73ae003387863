"""The ``idemstore`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import signal
import sys
from typing import TYPE_CHECKING, cast

from idemstore import __version__
from idemstore.argument_types import (
    concurrency_list,
    non_negative_int,
    positive_float,
    positive_int,
)
from idemstore.backends.urls import open_store
from idemstore.errors import ConfigurationError, IdemstoreError, MissingDependencyError
from idemstore.http.callers import NAMESPACE as HTTP_NAMESPACE
from idemstore.install_lines import install_line
from idemstore.mcp.commands import add_gateway_parser, add_proxy_parser
from idemstore.plan_command import add_plan_parser
from idemstore.protocol import offers
from idemstore.record_commands import add_caller_options, add_record_commands, scope_of_arguments

# Kept in step with idemstore.bench (which the CLI imports only when bench runs); a test checks.
SCENARIO_NAMES = (
    "fresh",
    "reserve",
    "replay",
    "contention",
    "mixed",
    "hasher",
    "proxy",
    "commands",
    "wake",
    "replay-writes",
    "replay-cache",
    "middleware",
    "gateway",
    "telemetry",
    "sync",
    "settle",
    "peers",
    "consumers",
    "cost",
)
DEFAULT_CONCURRENCY = (1, 16, 64)
DEFAULT_OPS = 2000
DEFAULT_PAYLOAD_BYTES = 256
# The epilog of every command that takes a store URL.
OPTIONS_POINTER = "A store URL's options: `idemstore options ENGINE` (e.g. postgres) lists them."

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence
    from typing import Any

    from idemstore.backends.registry import Engine
    from idemstore.backends.schema import SchemaMode
    from idemstore.protocol import Record

__all__ = ["main"]

EXIT_ABSENT = 1
EXIT_ERROR = 2
# 128 + SIGPIPE: what a shell reports for a process that wrote to a pipe nobody reads.
EXIT_BROKEN_PIPE = 141


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="milliseconds")


def _shown(value: bytes | None, limit: int = 2000) -> str:
    if value is None:
        return "-"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(value)} bytes, not UTF-8> {value[:64].hex()}"
    return text if len(text) <= limit else text[:limit] + f"... ({len(value)} bytes)"


def format_record(record: Record) -> str:
    """A record as aligned ``name: value`` lines for people; one ``checkpoint`` line per
    recovery point, oldest first."""
    shown = _shown(record.response)
    rows = [
        ("scope", repr(record.scope)),
        ("key", repr(record.key)),
        ("status", record.status.value),
        ("fingerprint", record.fingerprint),
        ("fence", str(record.fence)),
        ("token", record.token),
        ("created_at", _when(record.created_at)),
        ("expires_at", _when(record.expires_at)),
        ("lease_expires_at", _when(record.lease_expires_at)),
        ("response", shown),
        *(
            (f"checkpoint {number}", f"{point.name!r} {_shown(point.data, 200)}")
            for number, point in enumerate(record.checkpoints, 1)
        ),
    ]
    return "\n".join(f"{name:>16}: {value}" for name, value in rows)


async def _inspect(args: argparse.Namespace) -> int:
    scope = scope_of_arguments(args, HTTP_NAMESPACE)
    async with open_store(args.url) as store:
        record = await store.get(args.key, scope=scope)
    if record is None:
        print(f"no live record for key {args.key!r} in scope {scope!r}", file=sys.stderr)
        return EXIT_ABSENT
    print(format_record(record))
    return 0


async def _sweep(args: argparse.Namespace) -> int:
    from idemstore.backends.sweeper import Sweeper

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Not on Windows (NotImplementedError), nor outside the main thread (RuntimeError):
        # there Ctrl-C still ends the loop through KeyboardInterrupt.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with open_store(args.url) as store:
        sweeper = Sweeper(store, every=args.every or 60.0, limit=args.limit)
        while True:
            if args.every is None:
                removed = await sweeper.sweep_once()
                print(f"swept {removed} expired record(s)", flush=True)
                return 0
            try:
                removed = await sweeper.sweep_once()
            except IdemstoreError as exc:
                # A loop is a sidecar: an engine blip must not end it. Say so and go on.
                print(f"sweep failed: {exc}; retrying in {args.every:g}s", file=sys.stderr)
            else:
                print(f"swept {removed} expired record(s)", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.every)
            if stop.is_set():
                print(f"stopped; {sweeper.removed} record(s) swept in all", flush=True)
                return 0


async def _stats(args: argparse.Namespace) -> int:
    import json

    from idemstore.backends.stats import SupportsStats, format_stats
    from idemstore.telemetry import backend_name

    async with open_store(args.url) as store:
        if not offers(store, SupportsStats):
            raise ConfigurationError(
                f"the {backend_name(store)} backend cannot count its records (it has no stats())"
            )
        stats = await cast("SupportsStats", store).stats(limit=args.limit)
        backend = backend_name(store)
    if args.json:
        print(json.dumps({"backend": backend, **stats.to_dict()}, indent=2))
    else:
        print(format_stats(backend, stats))
    return 0


def _port_range(text: str) -> range:
    from idemstore.local_servers import parse_port_range

    try:
        return parse_port_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


async def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from idemstore.bench.estimate import plan_run
    from idemstore.bench.peers_scenario import default_scenarios
    from idemstore.bench.report import print_table, terminal_width, to_json, write_outputs
    from idemstore.bench.runner import BenchConfig, ConsoleProgress, bench

    if args.ports is not None and not args.local:
        raise ConfigurationError("--ports chooses the ports of the --local servers: add --local")

    config = BenchConfig(
        scenarios=tuple(dict.fromkeys(args.scenario or default_scenarios(SCENARIO_NAMES))),
        concurrency=args.concurrency,
        ops=None if args.duration is not None else args.ops,
        duration=args.duration,
        payload_bytes=args.payload_bytes,
        command=" ".join(["idemstore", *args.argv]),
    )
    plan = plan_run(config, args.url, local=args.local)
    # stderr's width (80 when it is no terminal), like the table's
    width = terminal_width(sys.stderr)
    _print_wrapped(f"idemstore bench: {plan.describe(config)}", width)
    # Progress only on a terminal: a pipe or a log file gets the table alone.
    progress = ConsoleProgress() if sys.stderr.isatty() else None
    with progress if progress is not None else contextlib.nullcontext():
        result = await bench(
            args.url, config, local=args.local, ports=args.ports, progress=progress
        )
    if args.json:
        sys.stdout.write(to_json(result))
    else:
        print_table(result, wide=args.wide)
    if args.out is not None:
        for path in write_outputs(result, Path(args.out)):
            print(f"wrote {path}", file=sys.stderr)
    elif result.measurements:
        _print_wrapped(
            "idemstore bench: no charts or results.md written: add --out DIR for them"
            " (results.json, results.md and, with the bench extra's matplotlib, the charts)",
            width,
        )
    if not result.measurements:
        print("idemstore: error: no backend could be measured", file=sys.stderr)
        return EXIT_ERROR
    # A duplicate execution is a correctness failure, whatever the numbers say.
    return EXIT_ABSENT if result.violations else 0


def _print_wrapped(text: str, width: int) -> None:
    """``text`` on stderr, wrapped at ``width`` columns, continuation lines indented."""
    import textwrap

    print(textwrap.fill(text, width, subsequent_indent="  "), file=sys.stderr)


async def _options(args: argparse.Namespace) -> int:
    from idemstore.backends.registry import engines, load_target

    if args.engine is None:
        print(f"{'engine':<10}  schemes")
        for engine in engines():
            print(f"{engine.name:<10}  {', '.join(s + '://' for s in engine.schemes)}")
        print(f"\n{OPTIONS_POINTER}")
        return 0
    engine = _engine_named(args.engine)
    schemes = ", ".join(scheme + "://" for scheme in engine.schemes)
    print(f"{engine.name}: {schemes}")
    if engine.driver and (engine.extra or engine.install):
        install = MissingDependencyError.install_line(engine.extra, engine.install)
        print(f"Needs {engine.driver}: {install}")
    if engine.options is None:
        print(f"the {engine.name} engine declares no options table; see its documentation")
        return EXIT_ABSENT
    print("Give options in the store URL (?name=value&...) or as keywords to open_store.\n")
    # The table's module imports no driver: this works before the extra is installed.
    sys.stdout.write(load_target(engine.options).text(width=80))
    return 0


def _engine_named(name: str) -> Engine:
    """The engine called ``name``, or whose scheme (or a URL of it) ``name`` is."""
    from idemstore.backends.registry import engine_for_scheme, engines, scheme_of

    wanted = name.lower()
    engine = {engine.name: engine for engine in engines()}.get(wanted) or engine_for_scheme(
        scheme_of(wanted) or wanted
    )
    if engine is None:
        known = ", ".join(engine.name for engine in engines())
        raise ConfigurationError(f"no engine or URL scheme is called {name!r}; known: {known}")
    return engine


async def _migrate(args: argparse.Namespace) -> int:
    from idemstore.backends.schema import run_schema

    mode: SchemaMode = "status" if args.status else "plan" if args.dry_run else "apply"
    report = await run_schema(args.url, mode)
    print(report.render())
    return 0


def _store_command(
    commands: Any,
    name: str,
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    **parser: Any,
) -> argparse.ArgumentParser:
    """A command over one store: its URL first, and the pointer to the URL options below."""
    command: argparse.ArgumentParser = commands.add_parser(name, epilog=OPTIONS_POINTER, **parser)
    command.add_argument("url", metavar="URL", help="store URL, e.g. sqlite:///idem.db")
    command.set_defaults(handler=handler)
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idemstore",
        description="Idempotency records for retried operations: migrate, inspect and sweep"
        " stores, benchmark backends, and deduplicate MCP tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"idemstore {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    migrate = _store_command(
        commands,
        "migrate",
        _migrate,
        help="bring a store's schema up to date (or print / report it)",
    )
    mode = migrate.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be applied (each pending migration's SQL, a table definition)",
    )
    mode.add_argument(
        "--status",
        action="store_true",
        help="report the schema: applied and pending migrations with checksums, or the table",
    )

    inspect = _store_command(commands, "inspect", _inspect, help="show the live record for a key")
    inspect.add_argument("key", metavar="KEY")
    add_caller_options(inspect)
    add_record_commands(commands, _store_command, HTTP_NAMESPACE)

    sweep = _store_command(commands, "sweep", _sweep, help="remove records past their retention")
    sweep.add_argument(
        "--every", type=positive_float, metavar="SECONDS", help="repeat until Ctrl-C / SIGTERM"
    )
    sweep.add_argument("--limit", type=positive_int, default=1000, help="batch size (default 1000)")

    stats = _store_command(
        commands,
        "stats",
        _stats,
        help="count live records by state, expired ones not yet removed, the oldest lease",
        description=(
            "Count the records of a store: in progress, lapsed, completed, past retention and"
            " not yet removed, and the age of the oldest in-progress record. SQL engines count"
            " in one query; Redis and DynamoDB read at most --limit records (see"
            " docs/observability.md for what each costs)."
        ),
    )
    stats.add_argument(
        "--limit",
        type=positive_int,
        default=100_000,
        help="most records a scanning backend reads (default 100000)",
    )
    stats.add_argument("--json", action="store_true", help="print JSON")

    bench = commands.add_parser(
        "bench",
        help="compare backends against each other and their raw-driver floors",
        description=(
            "Measure each store URL (no URL: the embedded memory and SQLite backends) on every"
            " scenario at every concurrency, beside its engine's raw-driver floor."
        ),
        epilog=OPTIONS_POINTER,
    )
    bench.add_argument(
        "url", metavar="URL", nargs="*", help="store URLs (default: memory:// and a temp SQLite)"
    )
    bench.add_argument(
        "--local",
        action="store_true",
        help="also start redis-server, PostgreSQL and moto on loopback and bench all backends"
        f" (needs {install_line('local')} for moto)",
    )
    bench.add_argument(
        "--ports",
        type=_port_range,
        metavar="LOW-HIGH",
        help="with --local: the loopback ports the servers may use, e.g. 21000-21100"
        " (default: free ports outside the ephemeral range)",
    )
    bench.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        choices=SCENARIO_NAMES,
        metavar="NAME",
        help="scenarios to run (default: all but consumers, which starts brokers, and cost;"
        f" peers only where a peer package is installed): {', '.join(SCENARIO_NAMES)}",
    )
    bench.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=DEFAULT_CONCURRENCY,
        metavar="N,N,...",
        help="concurrent workers, comma-separated (default: %(default)s)".replace(
            "%(default)s", ",".join(map(str, DEFAULT_CONCURRENCY))
        ),
    )
    amount = bench.add_mutually_exclusive_group()
    amount.add_argument(
        "--ops",
        type=positive_int,
        default=DEFAULT_OPS,
        metavar="N",
        help=f"operations per measurement (default {DEFAULT_OPS})",
    )
    amount.add_argument(
        "--duration", type=positive_float, metavar="S", help="seconds per measurement instead"
    )
    bench.add_argument(
        "--payload-bytes",
        type=non_negative_int,
        default=DEFAULT_PAYLOAD_BYTES,
        metavar="N",
        help=f"response size, and the hasher's value size (default {DEFAULT_PAYLOAD_BYTES})",
    )
    bench.add_argument(
        "--out", metavar="DIR", help="write results.json, results.md and PNG charts there"
    )
    bench.add_argument("--json", action="store_true", help="print JSON instead of the table")
    bench.add_argument(
        "--wide",
        action="store_true",
        help="every column (ops, p90, p99.9, errors, exact counts); the default table fits"
        " the terminal (80 columns when stdout is not one)",
    )
    bench.set_defaults(handler=_bench)

    options = commands.add_parser(
        "options",
        help="list the options a store URL may carry, per engine (no driver needed)",
        description=(
            "With no argument, list the engines and their URL schemes; with an engine's name or"
            " scheme (or a store URL), print the options its URLs take: name, type, default and"
            " meaning, from the options table the store itself checks them with."
        ),
    )
    options.add_argument(
        "engine", metavar="ENGINE_OR_SCHEME", nargs="?", help="e.g. postgres, sqlite, dynamodb"
    )
    options.set_defaults(handler=_options)

    add_proxy_parser(commands)
    add_gateway_parser(commands)
    add_plan_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _run(list(sys.argv[1:] if argv is None else argv))
        # What is still buffered for a pipe is written here: its reader may be gone too.
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        return _quietly_after_reader_left()
    return status


def _run(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `idemstore` alone: what it can do, not a usage error
        parser.print_help()
        return 0
    args.argv = argv
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]] = args.handler
    try:
        return asyncio.run(handler(args))
    except IdemstoreError as exc:
        print(f"idemstore: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``idemstore stats URL | head``),
    rather than some other pipe or socket of the command having broken."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll() here (Windows), or no stdout to ask: it was stdout


def _quietly_after_reader_left() -> int:
    """Exit like a Unix tool whose reader left: no traceback, and the status of a process
    that SIGPIPE ended (128 + 13), as a shell reports for ``yes | head -1``."""
    # Python flushes stdout again at exit and would report that failure too: point it at
    # /dev/null first.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
