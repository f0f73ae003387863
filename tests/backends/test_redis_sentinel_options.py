"""``redis+sentinel://`` URLs and the ``wait_replicas`` option: what is accepted and what is
refused before any I/O (the failover itself is in tests/reliability/test_redis_sentinel.py)."""

from __future__ import annotations

import pytest

from idemstore import ConfigurationError, open_store
from idemstore.backends.redis import RedisStore


def test_a_sentinel_url_names_the_sentinels_and_the_service() -> None:
    store = open_store("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/orders?db=2")
    assert isinstance(store, RedisStore)


def test_a_sentinel_url_without_a_service_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="SERVICE"):
        open_store("redis+sentinel://127.0.0.1:26379")


def test_wait_replicas_is_refused_on_a_cluster() -> None:
    with pytest.raises(ConfigurationError, match="not Redis Cluster"):
        open_store("redis+cluster://127.0.0.1:7000?wait_replicas=1")


def test_wait_replicas_timeout_must_be_shorter_than_the_socket_timeout() -> None:
    with pytest.raises(ConfigurationError, match="shorter than socket_timeout"):
        open_store("redis://127.0.0.1?wait_replicas=1&wait_replicas_timeout=5&socket_timeout=5")


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_wait_replicas_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError, match="wait_replicas"):
        open_store(f"redis://127.0.0.1?wait_replicas={value}")
