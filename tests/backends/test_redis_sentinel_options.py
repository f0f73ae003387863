"""``redis+sentinel://`` URLs and the ``wait_replicas`` option (on any Redis URL): what is
accepted and what is refused before any I/O (the failover itself is in
tests/reliability/test_redis_sentinel.py)."""

from __future__ import annotations

import pytest

from idemstore import ConfigurationError, open_store
from idemstore.backends.redis import RedisStore


def test_a_sentinel_url_names_the_sentinels_and_the_service() -> None:
    store = open_store("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/orders?db=2")
    assert isinstance(store, RedisStore)


def test_a_cluster_url_takes_wait_replicas() -> None:
    store = open_store("redis+cluster://127.0.0.1:7000,127.0.0.1:7001?wait_replicas=1")
    assert isinstance(store, RedisStore)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://127.0.0.1:26379", "SERVICE"),
        (
            "redis+cluster://127.0.0.1:7000?wait_replicas=1&wait_replicas_timeout=2"
            "&socket_timeout=1",
            "shorter than socket_timeout",
        ),
        (
            "redis://127.0.0.1?wait_replicas=1&wait_replicas_timeout=5&socket_timeout=5",
            "shorter than socket_timeout",
        ),
        ("redis://127.0.0.1?wait_replicas=-1", "wait_replicas"),
        ("redis://127.0.0.1?wait_replicas=many", "wait_replicas"),
    ],
    ids=[
        "a-sentinel-url-without-a-service",
        "a-cluster-wait-replicas-timeout-not-shorter-than-the-socket-timeout",
        "wait-replicas-timeout-not-shorter-than-the-socket-timeout",
        "a-negative-wait-replicas",
        "a-wait-replicas-that-is-no-number",
    ],
)
def test_a_sentinel_or_wait_replicas_url_is_refused_naming_why(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        open_store(url)
