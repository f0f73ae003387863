"""``CachedStore`` passes the whole store contract on real engines (Redis, PostgreSQL).

The suite runs in a pytest subprocess that loads ``tests.replay_cache_variants``, so this
session's registry keeps only the real engines; it uses this session's servers rather than
starting its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from idemstore.testing.fixtures.postgres import DSN_ENV as POSTGRES_DSN_ENV
from tests.contract.test_contract_kit import run_contract_suite

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.slow
def test_a_cached_store_over_redis_and_postgres_passes_the_whole_contract_suite(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_server_url: str,
    postgres_server: str,
) -> None:
    monkeypatch.setenv("IDEMSTORE_TEST_REDIS_URL", redis_server_url)
    monkeypatch.setenv(POSTGRES_DSN_ENV, postgres_server)
    ran = run_contract_suite(
        "tests.replay_cache_variants", "cached-redis", "cached-postgres", cwd=tmp_path
    )
    assert any("[cached-redis" in test_id for test_id in ran), ran[:5]
    assert any("[cached-postgres" in test_id for test_id in ran), ran[:5]
    assert all("[cached-" in test_id for test_id in ran), ran[:5]
