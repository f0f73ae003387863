"""SEP-3182 conformance through the real ``mcp`` client, for both adapters and both eras."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import pytest
from mcp.client._memory import InMemoryTransport
from mcp.client.session import ClientSession
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from idemstore.backends.memory import MemoryStore
from idemstore.errors import StoreUnavailableError
from idemstore.mcp.server import CONFLICT, IN_PROGRESS, INVALID_KEY, ServerIdempotency
from idemstore.testing import FakeClock
from tests.mcp_server.conftest import Harness, call, connect, error_of, unmarked
from tests.mcp_server.servers import Tools, build

if TYPE_CHECKING:
    from collections.abc import Callable

    from idemstore.protocol import IdempotencyStore


async def raw_capabilities(h: Harness) -> dict[str, Any]:
    """The capabilities object exactly as the server sent it (the typed models drop members)."""
    if h.era == "modern":
        raw = await h.client.session.send_discover(h.client.protocol_version)
        return dict(raw["capabilities"])
    async with InMemoryTransport(h.server) as (read, write), ClientSession(read, write) as session:
        request = types.InitializeRequest(
            params=types.InitializeRequestParams(
                protocol_version="2025-11-25",
                capabilities=types.ClientCapabilities(),
                client_info=types.Implementation(name="test", version="1"),
            )
        )
        raw = await session.send_request(request, TypeAdapter(dict[str, Any]))
        return dict(raw["capabilities"])


async def test_capability_is_advertised_with_no_members(harness: Harness) -> None:
    capabilities = await raw_capabilities(harness)
    assert capabilities["tools"]["idempotency"] == {}


async def test_retention_is_advertised_only_when_asked(make_harness: Callable[..., Any]) -> None:
    async with make_harness(retention=3600, advertise_retention=True) as h:
        capabilities = await raw_capabilities(h)
    assert capabilities["tools"]["idempotency"] == {"retentionSeconds": 3600}


async def test_call_without_key_runs_every_time(harness: Harness) -> None:
    first = await harness.call("charge", {"amount": 5})
    second = await harness.call("charge", {"amount": 5})
    assert harness.tools.count("charge") == 2
    assert first != second


async def test_null_key_is_the_same_as_no_key(harness: Harness) -> None:
    await harness.call("charge", {"amount": 5}, key=None)
    await harness.call("charge", {"amount": 5}, key=None)
    assert harness.tools.count("charge") == 2


async def test_retry_with_same_arguments_replays_without_running(harness: Harness) -> None:
    first = await harness.call("charge", {"amount": 5}, key="k-1")
    second = await harness.call("charge", {"amount": 5}, key="k-1")
    assert harness.tools.count("charge") == 1
    assert isinstance(first, dict)
    assert unmarked(second) == first


async def test_equivalent_arguments_replay(harness: Harness) -> None:
    first = await harness.call(
        "charge", {"amount": 1, "note": "caf\u00e9", "meta": {"a": 1, "b": [1, 2]}}, key="k-eq"
    )
    again = await harness.call(
        "charge", {"meta": {"b": [1.0, 2], "a": 1.0}, "note": "café", "amount": 1.0}, key="k-eq"
    )
    assert harness.tools.count("charge") == 1
    assert unmarked(again) == first


async def test_absent_and_empty_arguments_are_equivalent(harness: Harness) -> None:
    first = await harness.call("charge", None, key="k-empty")
    again = await harness.call("charge", {}, key="k-empty")
    assert harness.tools.count("charge") == 1
    assert unmarked(again) == first


async def test_other_key_runs_again(harness: Harness) -> None:
    await harness.call("charge", {"amount": 5}, key="k-a")
    await harness.call("charge", {"amount": 5}, key="k-b")
    assert harness.tools.count("charge") == 2


async def test_other_arguments_are_a_conflict_and_do_not_run(harness: Harness) -> None:
    await harness.call("charge", {"amount": 5}, key="k-c")
    error = error_of(await harness.call("charge", {"amount": 6}, key="k-c"))
    assert error["data"] == {"type": CONFLICT, "idempotencyKey": "k-c"}
    assert error["code"] == types.INVALID_PARAMS
    assert harness.tools.count("charge") == 1


async def test_other_tool_under_the_same_key_is_a_conflict(harness: Harness) -> None:
    await harness.call("charge", {"amount": 5}, key="k-t")
    error = error_of(await harness.call("slow", {"amount": 5, "seconds": 0.01}, key="k-t"))
    assert error["data"]["type"] == CONFLICT
    assert harness.tools.count("slow") == 0


async def test_conflict_does_not_disturb_the_recorded_outcome(harness: Harness) -> None:
    first = await harness.call("charge", {"amount": 5}, key="k-d")
    await harness.call("charge", {"amount": 7}, key="k-d")
    assert unmarked(await harness.call("charge", {"amount": 5}, key="k-d")) == first
    assert harness.tools.count("charge") == 1


async def test_duplicate_in_flight_is_rejected_at_once_without_running(harness: Harness) -> None:
    outcomes: list[Any] = []

    async def original() -> None:
        outcomes.append(await harness.call("slow", {"amount": 1}, key="k-slow"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(original)
        with anyio.fail_after(10):
            await harness.tools.started.wait()
        # Never blocks: the duplicate is answered while the original is still held open.
        with anyio.fail_after(5):
            duplicate = await harness.call("slow", {"amount": 1}, key="k-slow")
        assert not harness.tools.gate.is_set()
        harness.tools.gate.set()
    error = error_of(duplicate)
    assert error["data"] == {"type": IN_PROGRESS, "idempotencyKey": "k-slow"}
    assert harness.tools.count("slow") == 1
    # Once the original finished, a retry gets its outcome.
    assert unmarked(await harness.call("slow", {"amount": 1}, key="k-slow")) == outcomes[0]
    assert harness.tools.count("slow") == 1


async def test_is_error_result_is_replayed(harness: Harness) -> None:
    first = await harness.call("fail_result", {}, key="k-fail")
    again = await harness.call("fail_result", {}, key="k-fail")
    assert isinstance(first, dict) and first["isError"] is True
    assert unmarked(again) == first
    assert harness.tools.count("fail_result") == 1


async def test_exception_raised_by_tool_is_replayed(harness: Harness) -> None:
    first = await harness.call("explode", {}, key="k-boom")
    again = await harness.call("explode", {}, key="k-boom")
    assert harness.tools.count("explode") == 1
    if isinstance(first, MCPError):
        assert isinstance(again, MCPError)
        assert error_of(again) == error_of(first)
    else:
        assert first["isError"] is True
        assert unmarked(again) == first


async def test_protocol_error_raised_by_tool_is_replayed(harness: Harness) -> None:
    first = await harness.call("reject", {}, key="k-rej")
    again = await harness.call("reject", {}, key="k-rej")
    assert harness.tools.count("reject") == 1
    if harness.adapter == "lowlevel":
        assert error_of(first)["data"] == {"n": 1}
        assert error_of(again) == error_of(first)
    else:
        assert unmarked(again) == first


@pytest.mark.parametrize(
    "bad_key",
    ["", 42, True, ["k"], {"k": 1}, "x" * 256, "nul\x00key"],
    ids=["empty", "int", "bool", "list", "object", "too-long", "nul"],
)
async def test_invalid_key_is_invalid_params_and_does_not_run(
    harness: Harness, bad_key: Any
) -> None:
    error = error_of(await harness.call("charge", {"amount": 5}, key=bad_key))
    assert error["code"] == types.INVALID_PARAMS
    assert error["data"]["type"] == INVALID_KEY
    assert harness.tools.count("charge") == 0


async def test_key_at_the_length_limit_is_accepted(harness: Harness) -> None:
    key = "x" * 255
    first = await harness.call("charge", {"amount": 5}, key=key)
    assert unmarked(await harness.call("charge", {"amount": 5}, key=key)) == first
    assert harness.tools.count("charge") == 1


async def test_key_limit_is_an_option(make_harness: Callable[..., Any]) -> None:
    async with make_harness(max_key_length=8) as h:
        error = error_of(await h.call("charge", {"amount": 5}, key="123456789"))
        assert error["data"]["type"] == INVALID_KEY
        assert isinstance(await h.call("charge", {"amount": 5}, key="12345678"), dict)


# input_required results exist only in the 2026-07-28 ("modern") era.
@pytest.mark.parametrize("era", ["modern"])
async def test_input_required_is_not_recorded_and_continuations_bypass(harness: Harness) -> None:
    asked = await harness.call("ask", {}, key="k-ask")
    assert isinstance(asked, dict) and asked["resultType"] == "input_required"
    # Not recorded: the same initial call under the same key runs again.
    asked_again = await harness.call("ask", {}, key="k-ask")
    assert isinstance(asked_again, dict) and asked_again["resultType"] == "input_required"
    assert harness.tools.count("ask") == 2
    state = asked_again["requestState"]
    # Continuations carrying requestState pass straight through, key or not.
    done = await harness.call("ask", {}, key="k-ask", request_state=state)
    assert isinstance(done, dict) and "answered" in done["content"][0]["text"]
    await harness.call("ask", {}, key="k-ask", request_state=state)
    assert harness.tools.count("ask") == 4


async def test_replay_reaches_a_new_connection(harness: Harness) -> None:
    first = await harness.call("charge", {"amount": 5}, key="k-conn")
    async with connect(harness.server, harness.era) as other:
        assert unmarked(await call(other, "charge", {"amount": 5}, key="k-conn")) == first
    assert harness.tools.count("charge") == 1


def _as(client_id: str) -> Any:
    return auth_context_var.set(
        AuthenticatedUser(AccessToken(token=f"t-{client_id}", client_id=client_id, scopes=[]))
    )


async def test_keys_are_scoped_to_the_authenticated_principal(harness: Harness) -> None:
    token = _as("alice")
    try:
        alice = await harness.call("charge", {"amount": 5}, key="shared-key")
    finally:
        auth_context_var.reset(token)
    token = _as("bob")
    try:
        bob = await harness.call("charge", {"amount": 5}, key="shared-key")
        # Bob's other arguments under the same key are his own business: no conflict.
        assert isinstance(await harness.call("charge", {"amount": 9}, key="shared-key"), MCPError)
    finally:
        auth_context_var.reset(token)
    assert harness.tools.count("charge") == 2
    assert alice != bob
    token = _as("alice")
    try:
        assert unmarked(await harness.call("charge", {"amount": 5}, key="shared-key")) == alice
    finally:
        auth_context_var.reset(token)


async def test_scope_callable_separates_callers(make_harness: Callable[..., Any]) -> None:
    def tenant(ctx: Any) -> str | None:
        meta = (ctx.params or {}).get("_meta") or {}
        return meta.get("tenant")

    async with make_harness(scope=tenant) as h:
        a = await h.call("charge", {"amount": 5}, key="k-s", _meta={"tenant": "a"})
        b = await h.call("charge", {"amount": 5}, key="k-s", _meta={"tenant": "b"})
        again = await h.call("charge", {"amount": 5}, key="k-s", _meta={"tenant": "a"})
        assert unmarked(again) == a
        assert h.tools.count("charge") == 2
        assert a != b


async def test_servers_in_one_process_share_the_default_scope(
    adapter: str, era: str, store: IdempotencyStore
) -> None:
    tools_one, tools_two = Tools(), Tools()
    async with (
        connect(build(adapter, tools_one, store), era) as one,
        connect(build(adapter, tools_two, store), era) as two,
    ):
        first = await call(one, "charge", {"amount": 5}, key="k-proc")
        assert unmarked(await call(two, "charge", {"amount": 5}, key="k-proc")) == first
    assert tools_one.count("charge") + tools_two.count("charge") == 1


async def test_string_scope_separates_servers(
    adapter: str, era: str, store: IdempotencyStore
) -> None:
    tools_one, tools_two = Tools(), Tools()
    async with (
        connect(build(adapter, tools_one, store, scope="one"), era) as one,
        connect(build(adapter, tools_two, store, scope="two"), era) as two,
    ):
        await call(one, "charge", {"amount": 5}, key="k-str")
        await call(two, "charge", {"amount": 5}, key="k-str")
    assert tools_one.count("charge") == tools_two.count("charge") == 1


async def test_outcome_past_retention_runs_again(adapter: str, era: str) -> None:
    clock = FakeClock(1_000_000.0)
    store = MemoryStore(clock=clock)
    tools = Tools()
    async with connect(build(adapter, tools, store, retention=60), era) as client:
        await call(client, "charge", {"amount": 5}, key="k-ret")
        clock.advance(30)
        await call(client, "charge", {"amount": 5}, key="k-ret")
        assert tools.count("charge") == 1
        clock.advance(31)
        await call(client, "charge", {"amount": 5}, key="k-ret")
    assert tools.count("charge") == 2


def test_string_escapes_and_number_forms_fingerprint_alike() -> None:
    sep = ServerIdempotency(MemoryStore())._sep
    one = json.loads(
        '{"name":"t","idempotencyKey":"k",'
        '"arguments":{"s":"caf\\u00e9 \\"q\\"","n":1,"o":{"a":1,"b":2}}}'
    )
    two = json.loads(
        '{"idempotencyKey":"k","name":"t",'
        '"arguments":{"o":{"b":2.0,"a":1},"n":1.0,"s":"café \\u0022q\\u0022"}}'
    )
    first, second = sep.read(one), sep.read(two)
    assert first is not None and second is not None
    assert first.fingerprint == second.fingerprint


def test_mrtr_continuation_is_not_read_as_keyed() -> None:
    sep = ServerIdempotency(MemoryStore())._sep
    params = {"name": "t", "arguments": {}, "idempotencyKey": "k", "inputResponses": {}}
    assert sep.read(params) is None


class _DownStore(MemoryStore):
    """A store whose engine is unreachable."""

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("engine down")


async def test_unreachable_store_fails_the_call_without_running(adapter: str, era: str) -> None:
    tools = Tools()
    async with connect(build(adapter, tools, _DownStore()), era) as client:
        error = error_of(await call(client, "charge", {"amount": 5}, key="k-down"))
        assert error["code"] == types.INTERNAL_ERROR
        assert error["data"]["type"] == "idempotency_store_unavailable"
        # Calls without a key do not touch the store.
        assert isinstance(await call(client, "charge", {"amount": 5}), dict)
    assert tools.count("charge") == 1


def test_a_misspelt_option_is_named_and_a_bad_one_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"ServerIdempotency\(\) got unknown options \['lease'\]"):
        ServerIdempotency(MemoryStore(), lease=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="scope must be"):
        ServerIdempotency(MemoryStore(), scope=42)  # type: ignore[arg-type]
