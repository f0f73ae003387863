"""The Redis store's options, declared once (see ``idemstore.backends.store_options``).

Importing this module imports no driver: the CLI and the docs read the table without redis-py.
What a Redis URL says besides its query (hosts, user and password, database path, sentinel
service, scheme) is parsed in ``urls``; the rules that tie options together (``db`` and a
cluster, ``wait_replicas_timeout`` and ``socket_timeout``, TLS settings without TLS) are checked
by the store's constructor.
"""

from __future__ import annotations

import math
from typing import Any

from idemstore.backends.clock_skew import CLOCK_OPTIONS
from idemstore.backends.store_options import Option, Options, at_least, one_of
from idemstore.errors import ConfigurationError
from idemstore.records import MAX_KEY_LENGTH, check_duration

__all__ = ["DEFAULT_PREFIX", "OPTIONS", "TLS_SETTINGS", "check_together"]

DEFAULT_PREFIX = "idem:"

# expiry_grace is bounded so that PEXPIREAT's argument (retention deadline + grace, in ms)
# stays an integer a Lua number writes exactly.
_MAX_GRACE = 100 * 365 * 86400.0


def _prefix(name: str, value: str) -> str:
    if "{" in value or "}" in value:
        raise ConfigurationError(
            f"{name} {value!r} must not contain '{{' or '}}': the record's hash tag "
            "must be the first braces in the key"
        )
    return value


def _grace(name: str, value: float) -> float:
    if not math.isfinite(value) or not 0 <= value <= _MAX_GRACE:
        raise ConfigurationError(f"{name} must be 0 to {_MAX_GRACE:.0f} seconds, not {value!r}")
    return float(value)


OPTIONS = Options(
    Option(
        "prefix",
        str,
        DEFAULT_PREFIX,
        "start of every key; give each application (or test) its own. No `{` or `}`.",
        _prefix,
    ),
    Option(
        "db",
        int,
        0,
        "database number (single server and Sentinel only)",
        at_least(0),
        shown_default="the URL's path, or `0`",
    ),
    Option(
        "socket_timeout",
        float,
        5.0,
        "seconds one attempt of a command may take, connecting included, before it fails "
        "(and is retried)",
        check_duration,
    ),
    Option(
        "socket_connect_timeout",
        float,
        5.0,
        "seconds to open a connection: the TCP connect, then the handshake (`HELLO`, "
        "`AUTH`, `SELECT`) each within it; one that runs out is not retried (see "
        "[Errors](#errors))",
        check_duration,
    ),
    Option(
        "retries",
        int,
        2,
        "retries after a connection error, or after an attempt that ran out of "
        "`socket_timeout` on a server that answered the store before (with backoff, at most "
        "0.5 s)",
        at_least(0),
    ),
    Option(
        "operation_timeout",
        float,
        None,
        "hard cap in seconds on one call, retries included. Unset, a call gives up after "
        "`retries + 1` attempts, each bounded by `socket_timeout`. Setting it costs a second "
        "timer per call.",
        check_duration,
    ),
    Option(
        "max_connections",
        int,
        100,
        "operations in flight at once (per node on a cluster); more wait up to "
        "`socket_timeout` (or `operation_timeout`) for a free connection, then fail",
        at_least(1),
    ),
    Option(
        "expiry_grace",
        float,
        60.0,
        "seconds a record's key outlives its retention (see [Expiry](#expiry-and-sweep))",
        _grace,
    ),
    Option(
        "max_key_length", int, MAX_KEY_LENGTH, "longest accepted key, in characters", at_least(1)
    ),
    Option(
        "wait_replicas",
        int,
        0,
        "after every write, `WAIT` until this many replicas have it (on a cluster: replicas "
        "of the key's primary; see [Failover](#failover-to-a-replica-sentinel))",
        at_least(0),
    ),
    Option(
        "wait_replicas_timeout",
        float,
        1.0,
        "seconds `WAIT` may take (shorter than `socket_timeout`); fewer replicas in time "
        "raise `StoreUnavailableError`",
        check_duration,
    ),
    Option(
        "volatile_primary",
        str,
        "refuse",
        "with `wait_replicas`, what to do with a primary that has no AOF (a restart before a "
        "failover would lose what `WAIT` confirmed, see "
        "[Failover](#failover-to-a-replica-sentinel)): `refuse` (a `ConfigurationError`), "
        "`warn` (log once per primary) or `allow` (not checked)",
        one_of("refuse", "warn", "allow"),
    ),
    Option(
        "ssl",
        bool,
        False,
        "TLS: `rediss://` sets it, `ssl=true` asks for it on a cluster or Sentinel URL; the "
        "`ssl_*` options below need it",
        shown_default="`true` for `rediss://`",
    ),
    Option(
        "ssl_ca_certs",
        str,
        None,
        "file of the CA certificates that verify the server",
        shown_default="the system's",
    ),
    Option("ssl_certfile", str, None, "client certificate file, for servers that ask for one"),
    Option("ssl_keyfile", str, None, "private key file of `ssl_certfile`"),
    Option(
        "ssl_cert_reqs",
        str,
        "required",
        "whether the server's certificate must verify: `required`, `optional` or `none`",
        one_of("required", "optional", "none"),
    ),
    Option(
        "ssl_check_hostname",
        bool,
        True,
        "whether the server's certificate must name the host of the URL",
    ),
    *CLOCK_OPTIONS,
)

# The options redis-py takes for TLS (under the same names); set without TLS, they are refused.
TLS_SETTINGS = {option.name: option.default for option in OPTIONS if option.name.startswith("ssl_")}


def check_together(nodes: list[tuple[str, int]], cluster: bool, given: dict[str, Any]) -> None:
    """The rules that tie options together (the table checks each option alone)."""
    if not nodes:
        raise ConfigurationError("a redis store needs at least one host")
    if cluster and given["db"]:
        raise ConfigurationError("Redis Cluster has only database 0")
    socket_timeout = given["socket_timeout"]
    if given["wait_replicas"] and given["wait_replicas_timeout"] >= min(
        socket_timeout, given["operation_timeout"] or socket_timeout
    ):
        # WAIT holds its reply back that long: the socket must outlast it.
        raise ConfigurationError(
            f"wait_replicas_timeout ({given['wait_replicas_timeout']} s) must be shorter than "
            f"socket_timeout ({socket_timeout} s)"
        )
    if not given["ssl"] and any(given[name] != TLS_SETTINGS[name] for name in TLS_SETTINGS):
        raise ConfigurationError("ssl_* options need a rediss:// URL (or ssl=true)")
