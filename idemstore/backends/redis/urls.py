"""Redis store URLs: ``redis://``, ``rediss://``, ``redis+cluster://`` and
``redis+sentinel://``. What their hosts, user, password and path say; their query options are
the table's (``options.OPTIONS``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from idemstore.backends.redis.replication import DEFAULT_SENTINEL_PORT, service_of
from idemstore.backends.urls import StoreURL, malformed_url_error, parse_store_url, redact_url
from idemstore.errors import ConfigurationError

__all__ = ["DEFAULT_PORT", "RedisURL", "parse_redis_url"]

DEFAULT_PORT = 6379


@dataclass(frozen=True, slots=True)
class RedisURL:
    """A Redis URL's parts; ``parsed.options`` holds its query (and keyword) options."""

    nodes: list[tuple[str, int]]
    cluster: bool
    sentinel_service: str | None
    username: str | None
    password: str | None
    # From the scheme and the path: the defaults of the ssl and db options.
    ssl: bool
    db: int
    parsed: StoreURL


def parse_redis_url(url: str, options: dict[str, Any]) -> RedisURL:
    """``url``'s parts, with ``options`` (keyword options, which win) merged into its query."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    cluster = scheme == "redis+cluster"
    sentinel = scheme == "redis+sentinel"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise malformed_url_error(url, exc) from None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    default_port = DEFAULT_SENTINEL_PORT if sentinel else DEFAULT_PORT
    nodes = [_host_port(item, url, default_port) for item in hosts.split(",") if item]
    if not nodes:
        nodes = [("127.0.0.1", default_port)]
    if len(nodes) > 1 and not (cluster or sentinel):
        raise ConfigurationError(
            "several hosts need a redis+cluster:// URL; redis:// names one server"
        )
    # parse_store_url splits one host:port; give it the first so it handles the rest.
    first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    parsed = parse_store_url(urlunsplit(parts._replace(netloc=first)), options)
    path = parsed.path.strip("/")
    if path and not sentinel and not path.isdigit():
        raise ConfigurationError(
            f"the path of a redis URL is a database number: {redact_url(url)!r}"
        )
    return RedisURL(
        nodes=nodes,
        cluster=cluster,
        sentinel_service=service_of(path) if sentinel else None,
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password is not None else None,
        ssl=scheme == "rediss",
        db=int(path) if path and not sentinel else 0,
        parsed=parsed,
    )


def _host_port(item: str, url: str, default_port: int) -> tuple[str, int]:
    host, port = item, ""
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host:
        raise ConfigurationError(f"store URL {redact_url(url)!r} has an empty host")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        # Not echoed: a password with an unencoded '/' ends the host part early and lands here.
        raise ConfigurationError(f"store URL {redact_url(url)!r} has a bad port")
    return host, int(port)
