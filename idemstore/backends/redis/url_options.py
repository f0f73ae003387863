"""Redis store URLs: ``redis://``, ``rediss://``, ``redis+cluster://`` and
``redis+sentinel://``, and the options their query strings carry."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from idemstore.backends.redis.replication import DEFAULT_SENTINEL_PORT, service_of
from idemstore.errors import ConfigurationError
from idemstore.records import MAX_KEY_LENGTH
from idemstore.urls import (
    StoreURL,
    malformed_url_error,
    parse_store_url,
    pop_bool,
    pop_float,
    pop_int,
    pop_str,
    redact_url,
)

__all__ = ["DEFAULT_PORT", "DEFAULT_PREFIX", "parse_redis_url"]

DEFAULT_PORT = 6379
DEFAULT_PREFIX = "idem:"


def parse_redis_url(
    url: str, options: dict[str, Any]
) -> tuple[list[tuple[str, int]], dict[str, Any], StoreURL]:
    """The nodes, the store's keyword settings, and the parsed URL whose options were not
    consumed (for ``reject_unknown``)."""
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
    db = 0
    path = parsed.path.strip("/")
    service = service_of(path) if sentinel else None
    if path and not sentinel:
        if not path.isdigit():
            raise ConfigurationError(
                f"the path of a redis URL is a database number: {redact_url(url)!r}"
            )
        db = int(path)
    db = pop_int(parsed.options, "db", db)
    ssl_options: dict[str, Any] = {}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
        if name in parsed.options:
            ssl_options[name] = pop_str(parsed.options, name, "")
    if "ssl_check_hostname" in parsed.options:
        ssl_options["ssl_check_hostname"] = pop_bool(parsed.options, "ssl_check_hostname", True)
    tls = pop_bool(parsed.options, "ssl", scheme == "rediss")
    if ssl_options and not tls:
        raise ConfigurationError("ssl_* options need a rediss:// URL (or ssl=true)")
    settings: dict[str, Any] = dict(
        cluster=cluster,
        tls=tls,
        db=db,
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password is not None else None,
        prefix=pop_str(parsed.options, "prefix", DEFAULT_PREFIX),
        socket_timeout=pop_float(parsed.options, "socket_timeout", 5.0),
        socket_connect_timeout=pop_float(parsed.options, "socket_connect_timeout", 5.0),
        operation_timeout=(
            pop_float(parsed.options, "operation_timeout", 0.0)
            if "operation_timeout" in parsed.options
            else None
        ),
        retries=pop_int(parsed.options, "retries", 2),
        max_connections=pop_int(parsed.options, "max_connections", 100),
        expiry_grace=pop_float(parsed.options, "expiry_grace", 60.0),
        max_key_length=pop_int(parsed.options, "max_key_length", MAX_KEY_LENGTH),
        ssl_options=ssl_options,
        where=redact_url(url),
        sentinel_service=service,
        wait_replicas=pop_int(parsed.options, "wait_replicas", 0),
        wait_replicas_timeout=pop_float(parsed.options, "wait_replicas_timeout", 1.0),
    )
    return nodes, settings, parsed


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
