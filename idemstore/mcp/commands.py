"""The ``proxy`` and ``gateway`` subcommands of the ``idemstore`` command line.

Nothing here imports the MCP SDK or the HTTP stack: each handler imports what it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from idemstore.argument_types import positive_float, positive_int
from idemstore.backends.urls import open_store, redact_url
from idemstore.errors import ConfigurationError
from idemstore.mcp.caller_tokens import add_arguments as add_verifier_arguments
from idemstore.mcp.caller_tokens import verifier_from_args
from idemstore.mcp.gateway_settings import defer_defaults
from idemstore.mcp.relay_options import RelayOptions
from idemstore.mcp.relay_options import add_arguments as add_relay_arguments

__all__ = ["add_gateway_parser", "add_proxy_parser"]


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
    if args.ttl_ms is not None:
        args.retention = args.ttl_ms / 1000
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="idemstore proxy: %(levelname)s %(name)s: %(message)s",
    )
    async with open_store(_proxy_store_url(args)) as store:
        proxy = IdempotentProxy(
            store,
            key_scope=args.key_scope or default_key_scope(command),
            options=RelayOptions.from_args(args),
        )
        return await run_stdio_proxy(proxy, command)


async def _gateway(args: argparse.Namespace) -> int:
    from idemstore.callers import DEFAULT_SOURCES, CallerSources
    from idemstore.mcp.gateway import GatewayConfig, GatewayScope, McpGateway, parse_listen, serve
    from idemstore.mcp.gateway_settings import resolve

    resolve(args, os.environ)
    host, port = parse_listen(args.listen)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="idemstore gateway: %(levelname)s %(name)s: %(message)s",
    )
    config = GatewayConfig(
        upstream=args.upstream,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        max_body_bytes=args.max_body_bytes,
    )
    sources = list(args.caller or DEFAULT_SOURCES)
    if args.scope_header is not None:
        sources = [f"header:{args.scope_header}"]
    claim = _verified_claim(sources)
    verifier = verifier_from_args(args, claim)
    scope = GatewayScope(
        CallerSources(DEFAULT_SOURCES if claim else sources),
        unidentified=args.unidentified,
        verifier=verifier,
    )
    async with open_store(args.store) as store:
        gateway = McpGateway(
            store,
            config,
            scope=scope,
            verify_replays=not args.no_verify_replays,
            options=RelayOptions.from_args(args),
        )
        print(gateway.describe(args.listen, redact_url(args.store)), file=sys.stderr, flush=True)
        await serve(gateway, host, port, log_level=args.log_level)
    return 0


def _verified_claim(sources: list[str]) -> str | None:
    """``CLAIM`` of ``--caller jwt:CLAIM`` (``jwt`` alone: ``sub``), or None for credentials.

    A verified caller stands alone: with a verifier, a token that fails verification must not
    be told apart by its bytes instead."""
    verified = [s for s in sources if s.strip().lower().partition(":")[0] == "jwt"]
    if not verified:
        return None
    if len(sources) != 1:
        raise ConfigurationError(
            "--caller jwt:CLAIM stands alone: a token that fails verification must name"
            " nobody, not a caller by its bytes; drop the other --caller values"
        )
    claim = verified[0].strip().partition(":")[2].strip()
    return claim or "sub"


def add_gateway_parser(commands: Any) -> None:
    """The ``gateway`` subcommand: a Streamable HTTP reverse proxy."""
    gateway = commands.add_parser(
        "gateway",
        help="deduplicate tools/call in front of a remote MCP server (Streamable HTTP)",
        description=(
            "Serve a Streamable HTTP reverse proxy in front of one MCP endpoint, replaying the "
            "recorded result to retried tools/call requests; replicas sharing --store "
            "deduplicate together."
        ),
    )
    # Required, but from any source (flag, environment or file): defer_defaults checks them.
    gateway.add_argument("--listen", metavar="HOST:PORT", help="where to serve (required)")
    gateway.add_argument(
        "--upstream", metavar="URL", help="the MCP endpoint, e.g. http://h:9000/mcp (required)"
    )
    gateway.add_argument(
        "--store", default="memory://", metavar="URL", help="store URL (default memory://)"
    )
    gateway.add_argument(
        "--caller",
        action="append",
        metavar="SOURCE",
        help="who the caller is, records being kept per caller: jwt:CLAIM, a verified "
        "bearer token's claim (with --jwks or --introspect), or the credentials named by "
        "header:NAME, cookie:NAME or query:NAME (repeat it; default: "
        "header:authorization header:proxy-authorization)",
    )
    gateway.add_argument(
        "--scope-header", metavar="NAME", help="the same as --caller header:NAME alone"
    )
    gateway.add_argument(
        "--unidentified",
        choices=("relay", "refuse", "shared"),
        default="relay",
        help="a tools/call with no caller (no credential, or a token that fails "
        "verification): relay it without deduplication (default), refuse it (400), or, when "
        "it presents no credential at all, share one anonymous scope (only for an upstream "
        "that authenticates nobody)",
    )
    gateway.add_argument(
        "--no-verify-replays",
        action="store_true",
        help="serve recorded outcomes without first pinging the upstream with the caller's "
        "headers (that ping stops a revoked credential only if the upstream authorizes at "
        "the transport)",
    )
    add_verifier_arguments(gateway)
    add_relay_arguments(gateway)
    gateway.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="to open an upstream connection (default 10)",
    )
    gateway.add_argument(
        "--read-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="between bytes of an upstream answer (default: none, streams idle long)",
    )
    gateway.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=16 * 1024 * 1024,
        metavar="N",
        help="largest POST body read (default 16 MiB; larger gets 413)",
    )
    gateway.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of settings named like these flags; flags win over "
        "IDEMSTORE_GATEWAY_* environment variables, which win over the file",
    )
    defer_defaults(gateway, required=("listen", "upstream"))
    gateway.set_defaults(handler=_gateway)


def add_proxy_parser(commands: Any) -> None:
    """The ``proxy`` subcommand: a stdio relay in front of one MCP server."""
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
        "--ttl-ms", type=positive_float, metavar="MS", help="--retention in milliseconds"
    )
    proxy.add_argument(
        "--key-scope",
        metavar="SCOPE",
        help="scope of explicit keys (default: this user and the server command)",
    )
    add_relay_arguments(proxy)
    proxy.add_argument("server_command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    proxy.set_defaults(handler=_proxy)
