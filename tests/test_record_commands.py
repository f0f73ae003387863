"""``idemstore keys``, ``idemstore forget`` and ``idemstore inspect --caller/--user`` on every
built-in engine (the real ones the test session starts): an operator finds a key by state or
by the caller who sent it, and removes one record, asked first, a running lease refused, and
the removal logged."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
from typing import TYPE_CHECKING

import pytest

from idemstore import InProgressError, RecordChangedError, forget, open_store
from idemstore.backends.memory import MemoryStore
from idemstore.callers import CallerSources, Principal, scope_of_caller
from idemstore.cli import main
from idemstore.protocol import ForwardingStore, Outcome, Status

if TYPE_CHECKING:
    from idemstore.protocol import IdempotencyStore, Lease, Record

FP = "f" * 64
TOKEN = "Bearer t0k-of-alice"
# The scope the HTTP doors give a request carrying TOKEN and no principal.
ALICE = scope_of_caller("http", None, CallerSources(), [("authorization", TOKEN)])
ENGINES = {
    "memory": "memory_store_url",
    "sqlite": "sqlite_file_store_url",
    "postgres": "postgres_store_url",
    "redis": "redis_store_url",
    "dynamodb": "dynamodb_store_url",
}


class _Kept(ForwardingStore):
    """The one memory store every command of a test opens: leaving it closes nothing."""

    async def close(self) -> None:
        pass

    async def _leave(self, exc: BaseException | None) -> None:
        pass


@pytest.fixture(params=sorted(ENGINES))
def url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    made: str = request.getfixturevalue(ENGINES[request.param])
    if request.param == "memory":
        # A memory store lives in its process: every command gets the same one.
        kept = _Kept(MemoryStore())
        monkeypatch.setattr("idemstore.cli.open_store", lambda url: kept)
        monkeypatch.setattr("idemstore.record_commands.open_store", lambda url: kept)
        monkeypatch.setattr(__name__ + ".open_store", lambda url: kept)
    return made


def seed(url: str) -> dict[str, str]:
    """One running lease of ALICE's, one stuck lease and one completed record (scope '')."""

    async def reserve(store: IdempotencyStore, scope: str, lease_ttl: float) -> str:
        key = f"k-{time.monotonic_ns()}"
        reserved = await store.reserve(key, FP, scope=scope, lease_ttl=lease_ttl, retention=600)
        assert reserved.lease is not None
        if scope == "done":
            assert await store.complete(reserved.lease, b"ok")
        return key

    async def seeded() -> dict[str, str]:
        async with open_store(url) as store:
            keys = {
                "running": await reserve(store, ALICE, 600),
                "stuck": await reserve(store, "", 0.2),
                "done": await reserve(store, "done", 600),
            }
        await asyncio.sleep(0.3)
        return keys

    return asyncio.run(seeded())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_keys_lists_by_state_and_inspect_finds_a_key_by_its_caller(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = seed(url)
    status, out, _ = run(capsys, "keys", url, "--json")
    listed = {row["key"]: row["state"] for row in map(json.loads, out.splitlines())}
    assert status == 0
    assert listed == {
        keys["running"]: "in_progress",
        keys["stuck"]: "stuck",
        keys["done"]: "completed",
    }
    _, out, _ = run(capsys, "keys", url, "--state", "stuck")
    assert keys["stuck"] in out and keys["running"] not in out and out.startswith("STATE")
    _, out, _ = run(capsys, "keys", url, "--caller", TOKEN, "--json")
    assert [json.loads(line)["key"] for line in out.splitlines()] == [keys["running"]]
    _, out, _ = run(capsys, "keys", url, "--older-than", "1h")
    assert out.splitlines()[1:] == []

    status, out, _ = run(capsys, "inspect", url, keys["running"], "--caller", TOKEN)
    assert status == 0 and repr(ALICE) in out and "in_progress" in out
    status, _, err = run(capsys, "inspect", url, keys["running"], "--caller", "Bearer other")
    assert status == 1 and "no live record" in err


def test_forget_asks_refuses_a_running_lease_and_logs_who_removed_what(
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = seed(url)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    status, _, err = run(capsys, "forget", url, keys["stuck"])
    assert status == 1 and "nothing removed" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    with caplog.at_level(logging.WARNING, logger="idemstore.admin"):
        status, out, _ = run(capsys, "forget", url, keys["stuck"])
    assert status == 0 and "forgot the stuck record" in out
    (logged,) = [r for r in caplog.records if r.name == "idemstore.admin"]
    assert logged.levelno == logging.WARNING and keys["stuck"] in logged.getMessage()
    assert logged.idemstore_operator and logged.idemstore_fence == 1  # type: ignore[attr-defined]

    status, _, err = run(capsys, "forget", url, keys["running"], "--caller", TOKEN, "--yes")
    assert status == 2 and "running lease" in err and "--force" in err
    status, _, _ = run(capsys, "forget", url, keys["running"], "--caller", TOKEN, "-y", "--force")
    assert status == 0
    status, out, _ = run(capsys, "keys", url, "--json")
    assert [json.loads(line)["key"] for line in out.splitlines()] == [keys["done"]]


async def test_forget_as_a_library_call_refuses_a_running_lease_unless_forced() -> None:
    async with MemoryStore() as store:
        await store.reserve("k", FP, lease_ttl=60, retention=60)
        with pytest.raises(InProgressError, match="running lease") as raised:
            await forget(store, "k")
        assert raised.value.record is not None and raised.value.record.fence == 1
        forgotten = await forget(store, "k", force=True, who="ops@test")
        assert forgotten is not None and await store.get("k") is None
        assert await forget(store, "k") is None


class _TakenOverAfterRead(ForwardingStore):
    """A store where another caller takes a stuck key over right after ``forget`` read it."""

    taker: Lease | None = None

    async def _get(self, key: str, scope: str) -> Record | None:
        record = await self.wrapped.get(key, scope=scope)
        if record is not None and self.taker is None:
            taken = await self.wrapped.reserve(key, FP, scope=scope, lease_ttl=600, retention=600)
            self.taker = taken.lease
        return record


async def test_forget_never_removes_the_lease_of_a_caller_who_took_the_key_after_its_read(
    url: str,
) -> None:
    async with open_store(url) as store:
        key = f"k-{time.monotonic_ns()}"
        stuck = await store.reserve(key, FP, lease_ttl=0.2, retention=600)
        assert stuck.lease is not None
        await asyncio.sleep(0.3)
        racing = _TakenOverAfterRead(store)

        with pytest.raises(RecordChangedError, match="nothing was removed") as raised:
            await forget(racing, key)

        taker = racing.taker
        assert taker is not None and taker.fence == stuck.lease.fence + 1
        assert raised.value.record is not None and raised.value.record.fence == taker.fence
        # The new owner's record is still there: a retry while it works acquires nothing (no
        # second execution), its outcome is recorded, and a later retry replays it.
        executions = 1  # the taker's
        during = await store.reserve(key, FP, lease_ttl=600, retention=600)
        executions += during.outcome is Outcome.ACQUIRED
        assert await store.complete(taker, b"once")
        after = await store.reserve(key, FP, lease_ttl=600, retention=600)
        executions += after.outcome is Outcome.ACQUIRED
        assert executions == 1
        assert during.outcome is Outcome.IN_PROGRESS
        assert after.outcome is Outcome.COMPLETED
        assert after.record is not None and after.record.response == b"once"


async def test_forget_of_a_fence_removes_nothing_once_the_key_has_a_newer_one(url: str) -> None:
    async with open_store(url) as store:
        key = f"k-{time.monotonic_ns()}"
        await store.reserve(key, FP, lease_ttl=0.2, retention=600)
        await asyncio.sleep(0.3)
        taken = await store.reserve(key, FP, lease_ttl=0.2, retention=600)
        assert taken.lease is not None and taken.lease.fence == 2
        await asyncio.sleep(0.3)  # stuck as well: only the fence tells the two apart

        with pytest.raises(RecordChangedError, match="fence 1, now 2"):
            await forget(store, key, fence=1)

        assert (await store.get(key)) is not None
        assert await forget(store, key, fence=2) is not None
        assert await store.get(key) is None


@pytest.mark.parametrize("engine", sorted(set(ENGINES) - {"memory"}))
def test_forget_at_the_prompt_removes_nothing_when_the_key_is_taken_before_the_answer(
    engine: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another process's caller (here a thread with its own connections) takes the stuck key
    # over while the operator reads the prompt: the answer (even with --force) was about
    # fence 1, not about the new owner's running fence 2.
    url: str = request.getfixturevalue(ENGINES[engine])
    key = seed(url)["stuck"]
    taken: list[Lease | None] = []

    async def take_over() -> None:
        async with open_store(url) as store:
            reserved = await store.reserve(key, FP, lease_ttl=600, retention=600)
            taken.append(reserved.lease)

    class AnswerAfterTakeover(io.StringIO):
        def readline(self, size: int | None = -1) -> str:
            thread = threading.Thread(target=lambda: asyncio.run(take_over()))
            thread.start()
            thread.join()
            return super().readline(size)

    monkeypatch.setattr("sys.stdin", AnswerAfterTakeover("y\n"))
    status, _, err = run(capsys, "forget", url, key, "--force")

    assert status == 2 and "changed since it was read" in err and "nothing was removed" in err
    assert taken and taken[0] is not None and taken[0].fence == 2

    async def still_held() -> Record | None:
        async with open_store(url) as store:
            return await store.get(key)

    held = asyncio.run(still_held())
    assert held is not None and held.status is Status.IN_PROGRESS and held.fence == 2


@pytest.mark.parametrize(
    ("argv", "principal"),
    [
        (["--user", "42"], Principal("user", "42")),
        (["--user", "42", "--realm", "django-user"], Principal("django-user", "42")),
    ],
)
def test_inspect_user_derives_the_scope_of_the_http_doors_principal(
    argv: list[str], principal: Principal, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "inspect", "memory://", "k", *argv)
    assert status == 1
    assert repr(scope_of_caller("http", principal, None)) in err


def test_a_credential_that_names_nobody_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "inspect", "memory://", "k", "--caller", "Bearer")
    assert status == 2 and "names nobody" in err


def test_idemstore_alone_prints_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys)
    assert status == 0
    assert all(command in out for command in ("migrate", "inspect", "keys", "forget", "stats"))
