"""What an operator sees of the gateway: a startup line, and probes for a load balancer."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.gateway.processes import ENV, Child, free_port

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.gateway.processes import Upstream

ONE_MODE = pytest.mark.parametrize("upstream", ["stateless"], indirect=True)


@ONE_MODE
async def test_the_startup_line_says_where_what_and_how_callers_are_told_apart(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    gateway = gateways(upstream.url, "memory://", "--caller", "header:x-api-key")
    text = gateway.log.read_text()
    assert f"listening on http://127.0.0.1:{gateway.port}/mcp for {upstream.url}" in text
    assert "store memory://" in text
    assert "callers by the bytes of header:x-api-key (a refreshed credential is a new" in text
    assert "; unidentified relay; replays only after the upstream answers a ping" in text
    assert "only if the upstream authorizes at the transport" in text


@ONE_MODE
async def test_probes_answer_without_reaching_the_mcp_path(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    gateway = gateways(upstream.url)
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(base + "/healthz")
        ready = await client.get(base + "/readyz")
    assert (health.status_code, health.text) == (200, "ok\n")
    assert (ready.status_code, ready.text) == (200, "ready\n")
    assert upstream.executions() == []


async def test_readiness_fails_while_the_upstream_is_unreachable_and_health_does_not(
    gateways: Callable[..., Child],
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/mcp"
    gateway = gateways(nowhere)
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=10) as client:
        health = await client.get(base + "/healthz")
        ready = await client.get(base + "/readyz")
    assert health.status_code == 200
    assert ready.status_code == 503
    assert ready.text == "not ready: upstream: ConnectError\n"


@ONE_MODE
async def test_settings_come_from_flags_then_environment_then_the_config_file(
    upstream: Upstream, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\n'
        'upstream = "http://127.0.0.1:1/mcp"\n'  # the environment's wins
        'caller = ["header:x-api-key", "cookie:session"]\n'
        'unidentified = "shared"\n'  # the flag's wins
        "no-verify-replays = true\n"
    )
    argv = [sys.executable, "-m", "idemstore", "gateway", "--config", str(config)]
    child = Child(
        [*argv, "--unidentified", "refuse"],
        port,
        tmp_path / "gateway.out",
        env={"IDEMSTORE_GATEWAY_UPSTREAM": upstream.url},
    ).start()
    try:
        line = child.log.read_text()
        assert f"listening on http://127.0.0.1:{port}/mcp for {upstream.url}" in line
        assert "callers by the bytes of header:x-api-key cookie:session (" in line
        assert "; unidentified refuse; replays not checked with the upstream" in line
    finally:
        child.stop()


def _gateway_exits(config: Path, text: str, **environment: str) -> str:
    config.write_text('listen = "127.0.0.1:1"\nupstream = "http://h/mcp"\n' + text)
    done = subprocess.run(
        [sys.executable, "-m", "idemstore", "gateway", "--config", str(config)],
        capture_output=True,
        text=True,
        env={**ENV, **environment},
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_bad_setting_names_where_it_came_from(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    queue = _gateway_exits(config, "", IDEMSTORE_GATEWAY_IN_FLIGHT="queue")
    assert "IDEMSTORE_GATEWAY_IN_FLIGHT: 'queue' is not one of wait, reject" in queue
    assert "'lease' in the config file:" in _gateway_exits(config, 'lease = "soon"\n')
    misspelt = _gateway_exits(config, "leese = 3\n")
    assert "unknown setting(s) in the config file: leese" in misspelt
