"""tools/call through the gateway: replayed across replicas, never cached when it failed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.gateway.conftest import ONE_MODE, gateway_url
from tests.gateway.processes import free_port, start_upstream
from tests.gateway.rpc import call, open_session_id, post

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.gateway.processes import Child, Upstream
    from tests.gateway.rpc import Answer


def _text(answer: dict[str, Any]) -> str:
    return str(answer["result"]["content"][0]["text"])


def _assert_ran_once(upstream: Upstream, tool: str, answer: Answer, text: str) -> None:
    """The upstream ran ``tool`` once, and ``answer`` carries that run's ``text``."""
    assert _text(answer.final()) == text
    assert upstream.executions(tool) == [tool]


async def test_a_retry_on_the_other_replica_executes_once(
    upstream: Upstream, gateways: Callable[..., Child], redis_store_url: str
) -> None:
    a = gateway_url(gateways(upstream.url, redis_store_url, "--run-id", "shared"))
    b = gateway_url(gateways(upstream.url, redis_store_url, "--run-id", "shared"))
    async with httpx.AsyncClient(timeout=30) as client:
        session = await open_session_id(client, a)
        keyed: list[dict[str, Any]] = [
            {"idempotencyKey": "sep-1"},
            {"_meta": {"idempotency-key": "meta-1"}},
            {},  # no key: derived from the tool and its arguments
        ]
        for n, params in enumerate(keyed):
            first = await post(
                client, a, call(f"a{n}", "record", {"n": n}, **params), session=session
            )
            retry = await post(
                client, b, call(f"b{n}", "record", {"n": n}, **params), session=session
            )
            assert first.status == retry.status == 200
            assert retry.final()["id"] == f"b{n}"
            assert _text(retry.final()) == _text(first.final()) == f"recorded {n}"
    assert upstream.executions("record") == ["record"] * 3


@ONE_MODE
@pytest.mark.parametrize("key", ["derived", "sep"])
async def test_concurrent_duplicates_on_both_replicas_execute_once(
    upstream: Upstream, gateways: Callable[..., Child], redis_store_url: str, key: str
) -> None:
    urls = [
        gateway_url(gateways(upstream.url, redis_store_url, "--run-id", "race")) for _ in range(2)
    ]
    params = {"idempotencyKey": "race-1"} if key == "sep" else {}
    async with httpx.AsyncClient(timeout=30) as client:
        duplicates = [
            post(client, urls[i % 2], call(i, "slow", {"n": 1, "seconds": 0.5}, **params))
            for i in range(8)
        ]
        answers = [answer.final() for answer in await asyncio.gather(*duplicates)]
    assert upstream.executions("slow") == ["slow"]
    results = {_text(answer) for answer in answers if "result" in answer}
    assert results == {"slow 1 done"}
    rejected = [answer["error"]["data"]["type"] for answer in answers if "error" in answer]
    if key == "derived":
        assert rejected == []  # duplicates of a running call wait for it and get its result
    else:
        # SEP-3182: a duplicate while the original runs is rejected at once, never run.
        assert set(rejected) <= {"idempotency_key_in_progress"}


@ONE_MODE
async def test_a_tool_listed_as_read_only_always_runs_without_a_key(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    listing = await post(client, gateway, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    (look,) = [t for t in listing.final()["result"]["tools"] if t["name"] == "look"]
    assert look["annotations"]["readOnlyHint"] is True
    for n in range(2):
        await post(client, gateway, call(f"l{n}", "look", {"n": 1}))
        await post(client, gateway, call(f"r{n}", "record", {"n": 1}))
    # An explicit key is honoured even for a read-only tool.
    for n in range(2):
        await post(client, gateway, call(f"k{n}", "look", {"n": 2}, idempotencyKey="look-2"))
    assert upstream.executions("look") == ["look"] * 3
    assert upstream.executions("record") == ["record"]


@ONE_MODE
async def test_a_null_sep_key_is_stripped_and_read_as_absent(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--no-implicit"))
    async with httpx.AsyncClient(timeout=30) as client:
        answers = [
            await post(client, url, call(n, "record", {"n": 4}, idempotencyKey=None))
            for n in range(2)
        ]
    # FastMCP would refuse an unknown params member; both calls ran (no key, no derivation).
    assert [_text(a.final()) for a in answers] == ["recorded 4", "recorded 4"]
    assert upstream.executions("record") == ["record", "record"]


@ONE_MODE
async def test_sep_key_reused_with_other_arguments_is_a_conflict(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    await post(client, gateway, call(1, "record", {"n": 1}, idempotencyKey="k"))
    other = await post(client, gateway, call(2, "record", {"n": 2}, idempotencyKey="k"))
    error = other.final()["error"]
    assert error["data"] == {"type": "idempotency_key_conflict", "idempotencyKey": "k"}
    assert upstream.executions("record") == ["record"]


@ONE_MODE
@pytest.mark.parametrize(
    ("accept", "media"),
    [
        ("application/json, text/event-stream", "application/json"),
        ("application/json", "application/json"),
        ("text/event-stream", "text/event-stream"),
    ],
)
async def test_a_replay_is_rendered_as_the_retry_accepts(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient, accept: str, media: str
) -> None:
    first = await post(client, gateway, call(1, "record", {"n": 3}, idempotencyKey="r"))
    replay = await post(
        client, gateway, call(2, "record", {"n": 3}, idempotencyKey="r"), accept=accept
    )
    assert replay.status == 200
    assert replay.media == media
    assert len(replay.messages()) == 1
    final = replay.final()
    assert final["result"]["_meta"].pop(REPLAYED_META_KEY) is True
    assert final == {**first.final(), "id": 2}
    assert upstream.executions("record") == ["record"]


@ONE_MODE
async def test_callers_with_other_credentials_never_share_a_key(
    upstream: Upstream, gateways: Callable[..., Child], redis_store_url: str
) -> None:
    url = gateway_url(gateways(upstream.url, redis_store_url))
    alice = {"authorization": "Bearer alice-secret-token"}
    bob = {"authorization": "Bearer bob-secret-token"}
    async with httpx.AsyncClient(timeout=30) as client:
        message = call(1, "record", {"n": 1}, idempotencyKey="shared-key")
        await post(client, url, message, headers=alice)
        await post(client, url, message, headers=bob)
        again = await post(client, url, {**message, "id": 2}, headers=alice)
    assert again.final()["id"] == 2
    assert upstream.executions("record") == ["record", "record"]
    dump = await _redis_dump(redis_store_url)
    assert b"shared-key" in dump  # the records are there...
    assert b"alice-secret-token" not in dump and b"bob-secret-token" not in dump  # ...not tokens


@ONE_MODE
async def test_scope_header_names_the_boundary_instead_of_the_credential(
    upstream: Upstream, gateways: Callable[..., Child]
) -> None:
    url = gateway_url(gateways(upstream.url, "memory://", "--scope-header", "X-Tenant"))
    async with httpx.AsyncClient(timeout=30) as client:
        message = call(1, "record", {"n": 1}, idempotencyKey="k")
        await post(client, url, message, headers={"authorization": "t1", "x-tenant": "acme"})
        await post(client, url, message, headers={"authorization": "t2", "x-tenant": "acme"})
        await post(client, url, message, headers={"authorization": "t1", "x-tenant": "other"})
    assert upstream.executions("record") == ["record", "record"]


async def _redis_dump(url: str) -> bytes:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url.split("?")[0])
    try:
        parts = []
        async for key in client.scan_iter(count=1000):
            parts.append(key)
            kind = await client.type(key)
            if kind == b"string":
                parts.append(await client.get(key) or b"")
            elif kind == b"hash":
                for field, value in (await client.hgetall(key)).items():
                    parts += [field, value]
        return b"\n".join(parts)
    finally:
        await client.aclose()


# -- failures are not cached ------------------------------------------------------------------


@ONE_MODE
async def test_an_upstream_5xx_is_relayed_and_not_cached(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    for n in range(2):
        answer = await post(client, gateway, call(n, "http_500", {}, idempotencyKey="five"))
        assert answer.status == 500
        assert answer.body == b"upstream exploded"
    assert upstream.executions("http_500") == ["http_500"] * 2


async def test_connection_refused_is_a_502_and_the_retry_runs(
    tmp_path: Path, gateways: Callable[..., Child]
) -> None:
    port = free_port()
    url = gateway_url(gateways(f"http://127.0.0.1:{port}/mcp"))
    async with httpx.AsyncClient(timeout=30) as client:
        refused = await post(client, url, call(1, "record", {"n": 1}, idempotencyKey="late"))
        assert refused.status == 502
        upstream = start_upstream(tmp_path, "stateless", port)
        try:
            retry = await post(client, url, call(2, "record", {"n": 1}, idempotencyKey="late"))
        finally:
            upstream.child.stop()
    _assert_ran_once(upstream, "record", retry, "recorded 1")


@ONE_MODE
async def test_a_stream_cut_before_the_result_is_not_cached(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    for n in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            await post(client, gateway, call(n, "cut_stream", {}, idempotencyKey="cut"))
    assert upstream.executions("cut_stream") == ["cut_stream"] * 2


# -- a client that goes away mid-call ----------------------------------------------------------


async def _abandon(upstream: Upstream, url: str, message: dict[str, Any]) -> None:
    """Send ``message`` from a client that gives up before the answer; return once the
    upstream has started the tool, so the gateway holds a call nobody waits for."""
    async with httpx.AsyncClient(timeout=0.3) as impatient:
        with pytest.raises(httpx.TimeoutException):
            await post(impatient, url, message)
    await upstream.until_executed(message["params"]["name"])


@ONE_MODE
async def test_a_disconnected_sep_call_completes_once_and_its_retry_is_told_then_replayed(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    message = call(1, "slow", {"n": 5, "seconds": 1.5}, idempotencyKey="gone")
    await _abandon(upstream, gateway, message)
    # SEP-3182: a duplicate while the original runs is rejected at once (one that accepts an
    # event stream follows the original's answer instead: tests/gateway/test_attach.py).
    early = await post(client, gateway, {**message, "id": 2}, accept="application/json")
    assert early.final()["error"]["data"]["type"] == "idempotency_key_in_progress"
    for _ in range(100):
        late = await post(client, gateway, {**message, "id": 3})
        if "result" in late.final():
            break
        await asyncio.sleep(0.1)
    _assert_ran_once(upstream, "slow", late, "slow 5 done")


@ONE_MODE
async def test_a_disconnected_keyless_call_completes_once_and_its_retry_waits_for_it(
    upstream: Upstream, gateway: str, client: httpx.AsyncClient
) -> None:
    message = call(1, "slow", {"n": 6, "seconds": 1.5})
    await _abandon(upstream, gateway, message)
    retry = await post(client, gateway, {**message, "id": 2})
    _assert_ran_once(upstream, "slow", retry, "slow 6 done")
