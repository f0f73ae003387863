"""The contract suite's ``store`` on ``CachedStore`` over real engines: loading this module
(``pytest -p tests.replay_cache_variants``) adds the fixture variants ``cached-redis`` and
``cached-postgres``, each a fresh store of the engine's own fixtures behind the cache.

``CachedStore`` wraps a store rather than naming an engine by URL: the registry entry exists
only to carry the variants, and its scheme opens nothing in any test.
"""

from __future__ import annotations

import pytest

from idemstore import open_store
from idemstore.backends.cached import CachedStore
from idemstore.backends.registry import Engine, FixtureVariant, register_backend

__all__ = ["ENGINE", "cached_postgres_store", "cached_redis_store"]


@pytest.fixture
def cached_redis_store(redis_store_url: str) -> CachedStore:
    return CachedStore(open_store(redis_store_url), max_entries=64)


@pytest.fixture
def cached_postgres_store(postgres_store_url: str) -> CachedStore:
    return CachedStore(open_store(postgres_store_url), max_entries=64)


ENGINE = register_backend(
    Engine(
        name="replay-cache",
        schemes=("replay-cache",),
        store="idemstore.backends.cached:CachedStore",
        variants=(
            FixtureVariant("cached-redis", "cached_redis_store", cross_process=False),
            FixtureVariant("cached-postgres", "cached_postgres_store", cross_process=False),
        ),
        fixture_module=__name__,
    )
)
