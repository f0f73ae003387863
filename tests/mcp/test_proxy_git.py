"""A real third-party server from PyPI, ``mcp-server-git``, unmodified behind the proxy."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.mcp.raw import ENV, proxy_command

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from tests.mcp.raw import RawPeer

    Spawn = Callable[[list[str]], Awaitable[RawPeer]]


MODERN_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A fresh repository with one staged file and nothing committed."""
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.name", "Proxy Test")
    _git(path, "config", "user.email", "proxy@example.invalid")
    (path / "README.md").write_text("hello\n")
    _git(path, "add", "README.md")
    return path


def _git_server(repo: Path) -> list[str]:
    return [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]


@pytest.mark.parametrize("era", ["initialize", "server/discover"])
async def test_tools_list_is_identical_through_the_proxy(
    spawn: Spawn, repo: Path, era: str
) -> None:
    direct = await spawn(_git_server(repo))
    proxied = await spawn(proxy_command(server=_git_server(repo)))
    listings = []
    for peer in (direct, proxied):
        params = None
        if era == "initialize":
            await peer.initialize()
        else:
            params = {"_meta": MODERN_ENVELOPE}
            await peer.request(0, "server/discover", params)
        listing = await peer.request(1, "tools/list", params)
        assert any(tool["name"] == "git_commit" for tool in listing["result"]["tools"])
        listings.append(peer.lines[-1])
    assert listings[0] == listings[1]  # byte for byte


async def test_a_retried_git_commit_commits_once(repo: Path) -> None:
    command = proxy_command(server=_git_server(repo))
    params = StdioServerParameters(command=command[0], args=command[1:], env=ENV)
    arguments = {"repo_path": str(repo), "message": "first commit"}
    async with Client(params) as client:
        first = await client.call_tool("git_commit", arguments)
        retry = await client.call_tool("git_commit", arguments)
    assert not first.is_error
    assert "committed successfully" in first.content[0].text  # type: ignore[union-attr]
    assert retry.content == first.content
    assert len(_git(repo, "log", "--oneline").splitlines()) == 1


async def _status_twice(proxy: RawPeer, repo: Path) -> tuple[str, str]:
    """git_status, a change in the work tree, and the identical git_status again."""
    await proxy.initialize()
    listing = await proxy.request(1, "tools/list")
    status_tool = next(t for t in listing["result"]["tools"] if t["name"] == "git_status")
    assert status_tool["annotations"]["readOnlyHint"] is True
    texts = []
    for request_id in (2, 3):
        await proxy.call(request_id, "git_status", arguments={"repo_path": str(repo)})
        texts.append((await proxy.response(request_id))["result"]["content"][0]["text"])
        (repo / "NEW.txt").write_text("a change after the first status\n")
    return texts[0], texts[1]


async def test_a_retried_read_only_tool_returns_fresh_data(spawn: Spawn, repo: Path) -> None:
    proxy = await spawn(proxy_command(server=_git_server(repo)))
    first, retry = await _status_twice(proxy, repo)
    assert "NEW.txt" not in first
    assert "NEW.txt" in retry  # git_status is readOnlyHint: it ran again, on the new tree


async def test_dedupe_read_only_flag_deduplicates_read_only_tools_too(
    spawn: Spawn, repo: Path
) -> None:
    proxy = await spawn(proxy_command("--dedupe-read-only", server=_git_server(repo)))
    first, retry = await _status_twice(proxy, repo)
    assert retry == first  # replayed, as asked
