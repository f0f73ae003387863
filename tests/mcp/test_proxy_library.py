"""``IdempotentProxy`` in-process, over plain asyncio streams, with a store the test can read."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import ConfigurationError, StoreUnavailableError, fingerprint
from idemstore.backends.memory import MemoryStore
from idemstore.mcp.proxy import IdempotentProxy
from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.mcp.raw import ENV, executions, mock_command, unmarked, until_executed
from tests.memory_store import SmallItemStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


class MemoryPipe:
    """A byte stream within the process: what is written here is read from ``reader``."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader(limit=64 * 1024 * 1024)

    def write(self, data: bytes) -> None:
        self.reader.feed_data(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.reader.feed_eof()


class Harness:
    """A proxy between an in-memory client and the mock server as a subprocess."""

    def __init__(self, proxy: IdempotentProxy, server: asyncio.subprocess.Process) -> None:
        self.proxy = proxy
        self.server = server
        self.to_proxy = MemoryPipe()
        self.from_proxy = MemoryPipe()
        assert server.stdout is not None and server.stdin is not None
        self.task = asyncio.create_task(
            proxy.run(
                client_reader=self.to_proxy.reader,
                client_writer=self.from_proxy,
                server_reader=server.stdout,
                server_writer=server.stdin,
            )
        )

    def call(self, request_id: int, name: str, arguments: dict[str, Any]) -> None:
        params = {"name": name, "arguments": arguments}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        self.to_proxy.write(json.dumps(message).encode() + b"\n")

    async def next_message(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.from_proxy.reader.readline(), 20)
        message: dict[str, Any] = json.loads(line)
        return message


@pytest.fixture
async def start(counter: Path) -> AsyncIterator[Any]:
    harnesses: list[Harness] = []

    async def start(proxy: IdempotentProxy) -> Harness:
        server = await asyncio.create_subprocess_exec(
            *mock_command("--counter", str(counter)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=ENV,
        )
        harness = Harness(proxy, server)
        harnesses.append(harness)
        return harness

    yield start
    for harness in harnesses:
        if harness.server.returncode is None:
            harness.server.kill()
            await harness.server.wait()
        await asyncio.wait_for(harness.task, 20)


def _derived_key(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}:{fingerprint({'name': name, 'arguments': arguments})}"


async def test_server_crash_releases_the_keys_of_pending_calls(start: Any, counter: Path) -> None:
    store = MemoryStore()
    harness = await start(IdempotentProxy(store, run_id="crash-run"))
    arguments = {"amount": 1, "seconds": 30}
    harness.call(1, "charge", arguments)
    await until_executed(counter)
    key, scope = _derived_key("charge", arguments), "mcp-proxy/run/crash-run"
    held = await store.get(key, scope=scope)
    assert held is not None and held.status == "in_progress"
    harness.call(2, "crash", {})
    await asyncio.wait_for(harness.task, 20)
    assert await store.get(key, scope=scope) is None  # released: a retry runs again
    assert await harness.server.wait() == 3
    errors = {(await harness.next_message())["id"] for _ in range(2)}
    assert errors == {1, 2}


async def test_a_call_longer_than_its_lease_keeps_its_key_by_heartbeat(
    start: Any, counter: Path
) -> None:
    store = MemoryStore()  # one store shared by two proxies, like two processes on Redis
    first = await start(IdempotentProxy(store, run_id="shared", lease_ttl=0.3))
    second = await start(IdempotentProxy(store, run_id="shared", lease_ttl=0.3))
    arguments = {"amount": 7, "seconds": 1.2}  # four leases long
    first.call(1, "charge", arguments)
    await until_executed(counter)
    second.call(1, "charge", arguments)
    original, retry = await first.next_message(), await second.next_message()
    assert unmarked(retry["result"]) == original["result"]
    assert len(executions(counter)) == 1
    for harness in (first, second):
        harness.to_proxy.close()


class AwaitedMemoryStore(MemoryStore):
    """A memory store that does not declare ``answers_inline`` (a subclass never inherits
    it): the proxy then records each outcome before it relays the answer."""


@pytest.mark.parametrize(
    "store_type",
    [MemoryStore, AwaitedMemoryStore],
    ids=["relayed-then-recorded", "recorded-then-relayed"],
)
@pytest.mark.parametrize("sep_key", [True, False], ids=["sep-key", "derived-key"])
async def test_a_retry_sent_the_moment_the_answer_arrives_is_a_replay(
    start: Any, counter: Path, store_type: type[MemoryStore], sep_key: bool
) -> None:
    harness = await start(IdempotentProxy(store_type()))
    params: dict[str, Any] = {"name": "charge", "arguments": {"amount": 3}}
    if sep_key:
        params["idempotencyKey"] = "order-3"  # a duplicate in flight would be refused
    for request_id in (1, 2, 3):
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        harness.to_proxy.write(json.dumps(message).encode() + b"\n")
        answer = await harness.next_message()  # the retry goes out as soon as this is read
        assert answer["id"] == request_id and "result" in answer, answer
        replayed = REPLAYED_META_KEY in answer["result"].get("_meta", {})
        assert replayed == (request_id > 1)
    assert len(executions(counter)) == 1
    harness.to_proxy.close()


async def test_a_duplicate_waiting_for_its_original_holds_up_no_other_call(
    start: Any, counter: Path
) -> None:
    harness = await start(IdempotentProxy(MemoryStore()))
    harness.call(1, "charge", {"amount": 1, "seconds": 0.5})
    await until_executed(counter)
    harness.call(2, "charge", {"amount": 1, "seconds": 0.5})  # waits for call 1
    harness.call(3, "charge", {"amount": 2})
    answers = [await harness.next_message() for _ in range(3)]
    assert [answer["id"] for answer in answers] == [3, 1, 2]
    original, duplicate = answers[1]["result"], answers[2]["result"]
    assert REPLAYED_META_KEY in duplicate["_meta"] and unmarked(duplicate) == original
    assert [call["arguments"]["amount"] for call in executions(counter)] == [1, 2]
    harness.to_proxy.close()


async def test_the_client_closing_lets_the_server_finish_and_the_relay_end(
    start: Any, counter: Path
) -> None:
    harness = await start(IdempotentProxy(MemoryStore()))
    harness.call(1, "charge", {"amount": 1, "seconds": 0.3})
    harness.to_proxy.close()
    assert (await harness.next_message())["id"] == 1  # answered although the client left
    await asyncio.wait_for(harness.task, 20)
    assert harness.proxy.client_closed.is_set()
    assert await harness.server.wait() == 0


class UnreachableStore(MemoryStore):
    """A store whose engine cannot be reached."""

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("connection refused")


async def test_an_unreachable_store_fails_the_call_closed(start: Any, counter: Path) -> None:
    harness = await start(IdempotentProxy(UnreachableStore()))
    harness.call(1, "charge", {"amount": 1})
    error = (await harness.next_message())["error"]
    assert error["code"] == -32603
    assert error["data"]["type"] == "idempotency_store_unavailable"
    assert executions(counter) == []  # not run: a retry could not have been recognised
    harness.to_proxy.close()


def test_bad_policy_values_are_configuration_errors() -> None:
    store = MemoryStore()
    with pytest.raises(ConfigurationError):
        IdempotentProxy(store, in_flight="queue")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        IdempotentProxy(store, lease_ttl=0)
    with pytest.raises(ConfigurationError):
        IdempotentProxy(store, run_id="\x00")


async def test_derived_keys_are_remembered_ten_minutes_and_sep_keys_a_day(
    start: Any, counter: Path
) -> None:
    # mcp-idempotent's default (--ttl-ms 600000) for the keys it knows; SEP-3182 keys keep
    # the retention a server documents (24 hours).
    store = MemoryStore()
    harness = await start(IdempotentProxy(store, run_id="ttl-run", key_scope="ttl-keys"))
    harness.call(1, "charge", {"amount": 1})
    await harness.next_message()
    params = {"name": "charge", "arguments": {"amount": 2}, "idempotencyKey": "sep-1"}
    message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
    harness.to_proxy.write(json.dumps(message).encode() + b"\n")
    await harness.next_message()
    derived = await store.get(_derived_key("charge", {"amount": 1}), scope="mcp-proxy/run/ttl-run")
    sep = await store.get("sep-1", scope="ttl-keys")
    assert derived is not None and sep is not None
    assert derived.expires_at - derived.created_at == pytest.approx(600, abs=5)
    assert sep.expires_at - sep.created_at == pytest.approx(86400, abs=5)
    harness.to_proxy.close()


async def test_a_derived_key_does_not_cache_a_server_error(start: Any, counter: Path) -> None:
    harness = await start(IdempotentProxy(MemoryStore()))
    for request_id in (1, 2):
        harness.call(request_id, "fail", {})
        assert "error" in await harness.next_message()
    assert len(executions(counter)) == 2  # only successful completions are remembered
    harness.to_proxy.close()


async def test_a_result_too_large_for_the_store_is_refused_to_every_retry(
    start: Any, counter: Path
) -> None:
    # The store refuses the result (an item limit): the key keeps the "outcome not recorded"
    # marker, and retries get the refusal with the size and the limit, never a second run.
    harness = await start(IdempotentProxy(SmallItemStore()))
    harness.call(1, "charge", {"amount": 1})
    assert "result" in await harness.next_message()
    for request_id in (2, 3):
        harness.call(request_id, "charge", {"amount": 1})
        error = (await harness.next_message())["error"]
        assert error["code"] == -32600
        assert error["data"]["type"] == "idempotency_outcome_unrecorded"
        assert error["data"]["limit"] == SmallItemStore.LIMIT
        assert error["data"]["size"] > SmallItemStore.LIMIT
    assert len(executions(counter)) == 1
    harness.to_proxy.close()
