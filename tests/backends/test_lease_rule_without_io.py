"""The lease rule needs no I/O (issue 13, case 4): a lease no store could have issued is
refused before the store talks to its engine, so it is refused the same way even when the
engine is unreachable, instead of surfacing as ``StoreUnavailableError``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from idemstore import Lease, StoreUnavailableError, open_store
from idemstore.local_servers import free_port

if TYPE_CHECKING:
    from pathlib import Path

GENUINE = Lease("", "k", "0" * 32, 1, 0.0, 60.0)
FORGED = [
    dataclasses.replace(GENUINE, token=None),  # type: ignore[arg-type]
    dataclasses.replace(GENUINE, fence=True),
    dataclasses.replace(GENUINE, fence="1"),  # type: ignore[arg-type]
    dataclasses.replace(GENUINE, fence=1.0),  # type: ignore[arg-type]
    dataclasses.replace(GENUINE, token="a\x00b"),
]


def unreachable_urls(tmp_path: Path) -> dict[str, str]:
    port = free_port()  # nothing listens there
    return {
        "sqlite": f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}",
        "postgres": f"postgresql://idem@127.0.0.1:{port}/idem?connect_timeout=1",
        "redis": f"redis://127.0.0.1:{port}?socket_connect_timeout=1&retries=0",
        "dynamodb": (
            f"dynamodb://idem_table?region=us-east-1&endpoint_url=http://127.0.0.1:{port}"
            "&max_attempts=1&connect_timeout=1"
        ),
    }


@pytest.mark.parametrize("engine", ["sqlite", "postgres", "redis", "dynamodb"])
async def test_a_forged_lease_is_refused_without_reaching_the_engine(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(
        {"sqlite": "aiosqlite", "postgres": "asyncpg", "redis": "redis", "dynamodb": "aiobotocore"}[
            engine
        ]
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = open_store(unreachable_urls(tmp_path)[engine])
    try:
        # The engine is really unreachable: a genuine lease needs it.
        with pytest.raises(StoreUnavailableError):
            await store.release(GENUINE)
        for forged in FORGED:
            assert await store.complete(forged, b"x") is False
            assert await store.release(forged) is False
            assert await store.extend(forged, lease_ttl=60.0) is None
    finally:
        await store.close()
