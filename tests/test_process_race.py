"""Several processes sharing one store execute each key exactly once between them."""

from __future__ import annotations

import uuid

import pytest

from idemstore.backends.registry import fixture_variants
from tests.process_race import race

# Fixture variants whose store several processes can share (the registry says which):
# variant id -> fresh-store-URL fixture.
SHARED_STORE_URL_FIXTURES: dict[str, str] = {
    variant.id: variant.fixture for variant in fixture_variants() if variant.cross_process
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(SHARED_STORE_URL_FIXTURES))
def test_four_processes_execute_each_key_once(request: pytest.FixtureRequest, backend: str) -> None:
    url = request.getfixturevalue(SHARED_STORE_URL_FIXTURES[backend])
    keys = [f"race-{i}-{uuid.uuid4().hex[:8]}" for i in range(20)]
    report = race(url, keys, processes=4, tasks_per_key=3)
    assert report.errors == []
    assert dict(report.executions) == dict.fromkeys(keys, 1)
    # Every process got the one value the single execution produced.
    assert all(len(report.values[k]) == 1 for k in keys)
    assert set(report.values) == set(keys)
