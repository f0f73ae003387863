"""Store URLs that list several PostgreSQL hosts (libpq's ``h1:5432,h2:5432`` form), which
asyncpg tries in order with ``target_session_attrs`` choosing among them: a standby promoted
after a failover is found without changing the URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from idemstore.backends.urls import redact_url
from idemstore.errors import ConfigurationError

__all__ = ["split_host_list"]


def split_host_list(url: str) -> tuple[str, str | None]:
    """For a URL that lists several hosts (``postgresql://u@h1:5432,h2:5432/db``, libpq's form,
    which asyncpg reads and tries in order, with ``target_session_attrs`` choosing among them):
    the URL with its first host only, which the checks every store URL gets can parse, and the
    host part as written, for the DSN. A URL with one host comes back as it is, with ``None``.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url, None
    ends = [index for index in (rest.find(c) for c in "/?#") if index >= 0]
    end = min(ends, default=len(rest))
    netloc = rest[:end]
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return url, None
    for host in hosts.split(","):
        try:
            urlsplit(f"//{host}").port  # noqa: B018 (parsing it is the check)
        except ValueError:
            host = ""
        if not host or host.startswith(":"):
            raise ConfigurationError(
                f"malformed store URL {redact_url(url)!r}: every host in a host list needs "
                "a name and, optionally, a port (h1:5432,h2:5432)"
            )
    first = hosts.split(",", 1)[0]
    return f"{scheme}://{userinfo}{at}{first}{rest[end:]}", netloc
