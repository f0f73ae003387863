"""The ``idemstore`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from idemstore import __version__
from idemstore.errors import ConfigurationError, IdemstoreError
from idemstore.urls import open_store

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
    "middleware",
)
DEFAULT_CONCURRENCY = (1, 16, 64)
DEFAULT_OPS = 2000
DEFAULT_PAYLOAD_BYTES = 256

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence
    from typing import Any

    from idemstore.protocol import Record
    from idemstore.schema import SchemaMode

__all__ = ["main"]

EXIT_ABSENT = 1
EXIT_ERROR = 2


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="milliseconds")


def format_record(record: Record) -> str:
    """A record as aligned ``name: value`` lines for people."""
    response = record.response
    if response is None:
        shown = "-"
    else:
        try:
            text = response.decode("utf-8")
            shown = text if len(text) <= 2000 else text[:2000] + f"... ({len(response)} bytes)"
        except UnicodeDecodeError:
            shown = f"<{len(response)} bytes, not UTF-8> {response[:64].hex()}"
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
    ]
    return "\n".join(f"{name:>16}: {value}" for name, value in rows)


async def _inspect(args: argparse.Namespace) -> int:
    async with open_store(args.url) as store:
        record = await store.get(args.key, scope=args.scope)
    if record is None:
        print(f"no live record for key {args.key!r} in scope {args.scope!r}", file=sys.stderr)
        return EXIT_ABSENT
    print(format_record(record))
    return 0


async def _sweep(args: argparse.Namespace) -> int:
    from idemstore.sweeper import Sweeper

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


async def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from idemstore.bench.report import print_table, to_json, write_outputs
    from idemstore.bench.runner import BenchConfig, ConsoleProgress, bench

    config = BenchConfig(
        scenarios=tuple(dict.fromkeys(args.scenario or SCENARIO_NAMES)),
        concurrency=args.concurrency,
        ops=None if args.duration is not None else args.ops,
        duration=args.duration,
        payload_bytes=args.payload_bytes,
        command=" ".join(["idemstore", *args.argv]),
    )
    with ConsoleProgress() as progress:
        result = await bench(args.url, config, local=args.local, progress=progress)
    if args.json:
        sys.stdout.write(to_json(result))
    else:
        print_table(result, wide=args.wide)
    if args.out is not None:
        for path in write_outputs(result, Path(args.out)):
            print(f"wrote {path}", file=sys.stderr)
    if not result.measurements:
        print("idemstore: error: no backend could be measured", file=sys.stderr)
        return EXIT_ERROR
    # A duplicate execution is a correctness failure, whatever the numbers say.
    return EXIT_ABSENT if result.violations else 0


async def _migrate(args: argparse.Namespace) -> int:
    from idemstore.schema import run_schema

    mode: SchemaMode = "status" if args.status else "plan" if args.dry_run else "apply"
    report = await run_schema(args.url, mode)
    print(report.render())
    return 0


def _proxy_store_url(args: argparse.Namespace) -> str:
    """``--store`` as a URL; mcp-idempotent's ``memory`` / ``redis`` words are accepted too."""
    store: str = args.store
    if store == "memory":
        store = "memory://"
    elif store == "redis":
        store = args.redis_url or os.environ.get("REDIS_URL", "")
        if not store:
            raise ConfigurationError("--store redis needs --redis-url URL (or $REDIS_URL)")
        return store
    if args.redis_url is not None:
        raise ConfigurationError("--redis-url goes with --store redis; or pass --store URL")
    return store


async def _proxy(args: argparse.Namespace) -> int:
    from idemstore.mcp.proxy import IdempotentProxy, default_key_scope, run_stdio_proxy

    command = list(args.server_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigurationError("no server command: idemstore proxy [options] -- CMD [ARGS ...]")
    if args.retention is not None and args.ttl_ms is not None:
        raise ConfigurationError("give --retention SECONDS or --ttl-ms MS, not both")
    retention = args.retention
    if args.ttl_ms is not None:
        retention = args.ttl_ms / 1000
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="idemstore proxy: %(levelname)s %(name)s: %(message)s",
    )
    async with open_store(_proxy_store_url(args)) as store:
        proxy = IdempotentProxy(
            store,
            run_id=args.run_id,
            key_scope=args.key_scope or default_key_scope(command),
            lease_ttl=args.lease,
            retention=retention if retention is not None else 600.0,
            sep_retention=args.sep_retention,
            in_flight=args.in_flight,
            implicit=not args.no_implicit,
            tools=args.tools or ("*",),
            exclude_tools=args.exclude_tools or (),
            dedupe_read_only=args.dedupe_read_only,
            cancel_grace=args.cancel_grace,
        )
        return await run_stdio_proxy(proxy, command)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _concurrency_list(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 1,16,64, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1: {text!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idemstore",
        description="Idempotency records for retried operations: migrate, inspect and sweep"
        " stores, benchmark backends, and deduplicate MCP tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"idemstore {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = commands.add_parser(
        "migrate", help="bring a store's schema up to date (or print / report it)"
    )
    migrate.add_argument("url", metavar="URL", help="store URL, e.g. sqlite:///idem.db")
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
    migrate.set_defaults(handler=_migrate)

    inspect = commands.add_parser("inspect", help="show the live record for a key")
    inspect.add_argument("url", metavar="URL", help="store URL, e.g. sqlite:///idem.db")
    inspect.add_argument("key", metavar="KEY")
    inspect.add_argument("--scope", default="", help="the key's scope (default: '')")
    inspect.set_defaults(handler=_inspect)

    sweep = commands.add_parser("sweep", help="remove records past their retention")
    sweep.add_argument("url", metavar="URL")
    sweep.add_argument(
        "--every", type=_positive_float, metavar="SECONDS", help="repeat until Ctrl-C / SIGTERM"
    )
    sweep.add_argument(
        "--limit", type=_positive_int, default=1000, help="batch size (default 1000)"
    )
    sweep.set_defaults(handler=_sweep)

    bench = commands.add_parser(
        "bench",
        help="compare backends against each other and their raw-driver floors",
        description=(
            "Measure each store URL (no URL: the embedded memory and SQLite backends) on every"
            " scenario at every concurrency, beside its engine's raw-driver floor."
        ),
    )
    bench.add_argument(
        "url", metavar="URL", nargs="*", help="store URLs (default: memory:// and a temp SQLite)"
    )
    bench.add_argument(
        "--local",
        action="store_true",
        help="also start redis-server, PostgreSQL and moto on loopback and bench all backends",
    )
    bench.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        choices=SCENARIO_NAMES,
        metavar="NAME",
        help=f"scenarios to run (default: all): {', '.join(SCENARIO_NAMES)}",
    )
    bench.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=DEFAULT_CONCURRENCY,
        metavar="N,N,...",
        help="concurrent workers, comma-separated (default: %(default)s)".replace(
            "%(default)s", ",".join(map(str, DEFAULT_CONCURRENCY))
        ),
    )
    amount = bench.add_mutually_exclusive_group()
    amount.add_argument(
        "--ops",
        type=_positive_int,
        default=DEFAULT_OPS,
        metavar="N",
        help=f"operations per measurement (default {DEFAULT_OPS})",
    )
    amount.add_argument(
        "--duration", type=_positive_float, metavar="S", help="seconds per measurement instead"
    )
    bench.add_argument(
        "--payload-bytes",
        type=_non_negative_int,
        default=DEFAULT_PAYLOAD_BYTES,
        metavar="N",
        help=f"response size (default {DEFAULT_PAYLOAD_BYTES})",
    )
    bench.add_argument(
        "--out", metavar="DIR", help="write results.json, results.md and PNG charts there"
    )
    bench.add_argument("--json", action="store_true", help="print JSON instead of the table")
    bench.add_argument(
        "--wide",
        action="store_true",
        help="every column (ops, p90, p99.9, errors); the default table fits 100 columns",
    )
    bench.set_defaults(handler=_bench)

    proxy = commands.add_parser(
        "proxy",
        help="deduplicate tools/call in front of an MCP server (stdio)",
        usage="idemstore proxy [options] -- CMD [ARGS ...]",
        description=(
            "Start CMD as an MCP server and relay stdio to it, replaying the recorded result "
            "to retried tools/call requests instead of running the tool again."
        ),
    )
    proxy.add_argument(
        "--store",
        default="memory://",
        metavar="URL",
        help="store URL (default memory://); 'memory' and 'redis' are accepted too",
    )
    proxy.add_argument(
        "--redis-url", metavar="URL", help="with --store redis (default: $REDIS_URL)"
    )
    proxy.add_argument(
        "--retention",
        type=_positive_float,
        metavar="SECONDS",
        help="how long a derived or _meta key's result is replayed (default 600)",
    )
    proxy.add_argument(
        "--ttl-ms", type=_positive_float, metavar="MS", help="the same in milliseconds"
    )
    proxy.add_argument(
        "--sep-retention",
        type=_positive_float,
        default=86400.0,
        metavar="SECONDS",
        help="how long a SEP-3182 key's outcome is replayed (default 86400)",
    )
    proxy.add_argument(
        "--lease",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="lease of a running call, heartbeated every third (default 30)",
    )
    proxy.add_argument(
        "--run-id", metavar="ID", help="scope of derived keys (default: one per proxy process)"
    )
    proxy.add_argument(
        "--key-scope",
        metavar="SCOPE",
        help="scope of explicit keys (default: this user and the server command)",
    )
    proxy.add_argument(
        "--in-flight",
        choices=("wait", "reject"),
        default="wait",
        help="a duplicate of a running call without a SEP-3182 key: wait for it (default) "
        "or reject it",
    )
    proxy.add_argument(
        "--no-implicit",
        action="store_true",
        help="deduplicate only calls that carry a key (no derived keys)",
    )
    proxy.add_argument(
        "--tools", nargs="+", metavar="GLOB", help="tools that get derived keys (default: all)"
    )
    proxy.add_argument(
        "--exclude-tools", nargs="+", metavar="GLOB", help="tools that never get derived keys"
    )
    proxy.add_argument(
        "--dedupe-read-only",
        action="store_true",
        help="derive keys for tools annotated readOnlyHint too (default: they always run)",
    )
    proxy.add_argument(
        "--cancel-grace",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="a cancelled SEP-3182 call keeps its key this long without an answer (default 60)",
    )
    proxy.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="logs go to stderr (default warning)",
    )
    proxy.add_argument("server_command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    proxy.set_defaults(handler=_proxy)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]] = args.handler
    try:
        return asyncio.run(handler(args))
    except IdemstoreError as exc:
        print(f"idemstore: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
