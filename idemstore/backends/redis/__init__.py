"""``redis://``, ``rediss://``, ``redis+cluster://h1:p1,h2:p2`` and
``redis+sentinel://s1:p1,s2:p2/service``: records in Redis hashes.

Every operation is one Lua script (``lua/*.lua``) run with EVALSHA on exactly one key, so it
is one round trip, atomic, and works unchanged on Redis Cluster. Lease and retention deadlines
are hash fields compared with the server's ``TIME``; the key's own expiry removes a record by
itself shortly after its retention ends (``expiry_grace``). ``wait`` is woken by a PUBLISH
that ``complete``, ``release`` and ``delete`` send from inside their script.

Modules: ``store`` (the store), ``options`` (its options table; imports no driver),
``urls`` (what a URL's hosts, user and path say), ``clients`` (the redis-py clients it
builds), ``scripts`` (loads the Lua), ``codec`` (key names and hash fields), ``notifier``
(the shared pub/sub connection), ``replication`` (Sentinel and ``wait_replicas``),
``client_errors`` (redis-py's exceptions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.redis.codec import record_key
from idemstore.backends.registry import imported_on_first_use

__all__ = ["RedisStore", "record_key"]

if TYPE_CHECKING:
    from idemstore.backends.redis.store import RedisStore


__getattr__ = imported_on_first_use(
    __name__, RedisStore="idemstore.backends.redis.store:RedisStore"
)
