"""The WSGI middleware under gunicorn with two worker processes: duplicates storming both
workers at once run the side effect once per key."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import httpx
import pytest

from idemstore.local_servers import ServerUnavailableError, free_port, wait_for_port
from tests.conftest import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow

ALICE = {"Authorization": "Bearer alice"}


@pytest.fixture(params=["redis", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    store_url = request.getfixturevalue(f"{request.param}_store_url")
    effects = tmp_path / "effects.txt"
    effects.touch()
    port = free_port()
    log = tmp_path / "gunicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "IDEMSTORE_TEST_STORE": store_url,
        "IDEMSTORE_TEST_EFFECTS": str(effects),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--workers",
                "2",
                "--threads",
                "4",
                "--bind",
                f"127.0.0.1:{port}",
                "tests.wsgi.apps:gunicorn_app()",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            wait_for_port(port, process=process, timeout=30, log=log)
        except ServerUnavailableError as exc:
            pytest.fail(f"gunicorn did not start: {exc}")
        yield f"http://127.0.0.1:{port}", effects
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_duplicate_storms_across_workers_run_each_effect_once(served: tuple[str, Path]) -> None:
    url, effects = served
    keys = [uuid.uuid4().hex for _ in range(6)]

    async def storm() -> list[httpx.Response]:
        # Separate connections, so that gunicorn spreads them over both workers.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/orders?sleep=0.3",
                        json={"key": key},
                        headers={**ALICE, "Idempotency-Key": f'"{key}"'},
                    )
                    for key in keys
                    for _ in range(6)
                )
            )

    responses = asyncio.run(storm())
    assert {r.status_code for r in responses} <= {201, 409}
    executed = Counter(line.split()[0].strip('"') for line in effects.read_text().splitlines())
    assert executed == dict.fromkeys(keys, 1)

    async def retry() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return [
                await client.post(
                    "/orders?sleep=0.3",
                    json={"key": key},
                    headers={**ALICE, "Idempotency-Key": f'"{key}"'},
                )
                for key in keys
            ]

    retries = asyncio.run(retry())
    assert all(r.status_code == 201 and r.headers["idempotent-replayed"] == "true" for r in retries)
    assert len(effects.read_text().splitlines()) == len(keys)
