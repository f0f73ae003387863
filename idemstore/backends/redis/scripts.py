"""The Lua scripts of the Redis backend, read from the ``.lua`` files next to this module.

Each script is the prelude (server clock, deadline guard) followed by its parts; every script
touches exactly one key, so it runs unchanged on Redis Cluster.
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["RANGE_ERROR", "SCRIPTS", "SHARDED_SCRIPTS", "Script"]

# The error a script answers when a deadline would pass 2**53 microseconds (prelude.lua).
RANGE_ERROR = "IDEMSTORE_RANGE"

_PARTS = {
    "reserve": ("reserve",),
    "complete": ("finish_check", "complete"),
    "release": ("finish_check", "release"),
    "extend": ("extend",),
    "checkpoint": ("checkpoint",),
    "get": ("get",),
    "delete": ("delete",),
    "sweep": ("sweep",),
}


class Script:
    """A script's source and the SHA-1 that EVALSHA names it by."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def _read(part: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{part}.lua").read_text("utf-8")


SCRIPTS = {
    name: Script("".join(_read(part) for part in ("prelude", *parts)))
    for name, parts in _PARTS.items()
}


# On Redis Cluster 7 and later: the same scripts announcing with SPUBLISH, whose message stays
# on the shard that owns the key (a PUBLISH is broadcast over the cluster bus to every node).
SHARDED_SCRIPTS = {
    name: Script(script.source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',"))
    for name, script in SCRIPTS.items()
}
