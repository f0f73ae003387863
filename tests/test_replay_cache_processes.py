"""Two processes, each with its own ``CachedStore`` over one shared real engine: the caches
never cause a second execution and never answer a different outcome than the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("url_fixture", ["redis_store_url", "postgres_store_url"])
def test_two_processes_with_their_own_caches_agree_and_execute_each_key_once(
    request: pytest.FixtureRequest, url_fixture: str
) -> None:
    url = request.getfixturevalue(url_fixture)
    keys = [f"cached-{i}-{uuid.uuid4().hex[:8]}" for i in range(10)]
    args = [sys.executable, "-m", "tests.replay_cache_racer", url, "3", "3", *keys]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [
        subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    executions: Counter[str] = Counter()
    values: dict[str, set[str]] = {}
    conflicts: Counter[str] = Counter()
    hits = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err[-2000:]
        for line in out.splitlines():
            event = json.loads(line)
            if "exec" in event:
                executions[event["exec"]] += 1
            elif "result" in event:
                values.setdefault(event["result"], set()).add(event["value"])
            elif "conflict" in event:
                conflicts[event["conflict"]] += 1
            else:
                hits.append(event["hits"])
    assert dict(executions) == dict.fromkeys(keys, 1)
    # Every call in both processes, first or replayed from either cache, saw the one outcome.
    assert {key: len(seen) for key, seen in values.items()} == dict.fromkeys(keys, 1)
    # Other arguments on a completed key conflict in both processes (never a second run).
    assert dict(conflicts) == dict.fromkeys(keys, 2)
    # The caches answered replays: otherwise this test proved nothing about them.
    assert len(hits) == 2
    assert all(count > 0 for count in hits)
