"""idemstore.sync: the async runner's rules, for plain functions called from threads."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from idemstore import (
    ConfigurationError,
    ConflictError,
    Idempotency,
    InProgressError,
    OutcomeUnknownError,
    UnrecordableResultError,
    current_execution,
    open_store,
)
from idemstore import sync as idem_sync

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def new_key() -> str:
    return f"sync-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def runner(server_store_url: str) -> Iterator[idem_sync.Idempotency]:
    with idem_sync.Idempotency(server_store_url) as opened:
        yield opened


def in_threads(count: int, call: Callable[[], object]) -> list[object]:
    """Call ``call`` from ``count`` threads started together; what each returned or raised."""
    barrier = threading.Barrier(count)
    outcomes: list[object] = [None] * count

    def one(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = call()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_threads_racing_one_key_execute_it_once(store_url: str) -> None:
    key = new_key()
    executions = Counter[str]()
    lock = threading.Lock()

    def work() -> bytes:
        with lock:
            executions[key] += 1
        time.sleep(0.1)
        return f"made by {threading.get_ident()}".encode()

    with idem_sync.Idempotency(store_url) as idem:
        outcomes = in_threads(8, lambda: idem.run(key, "fp", work))
    assert executions[key] == 1
    values = {getattr(o, "value", o) for o in outcomes}
    assert len(values) == 1
    assert sum(not getattr(o, "replayed", True) for o in outcomes) == 1


def test_sync_and_async_callers_racing_one_key_execute_it_once(shared_store_url: str) -> None:
    key = new_key()
    ran: list[str] = []
    barrier = threading.Barrier(2)
    results: dict[str, bytes] = {}

    def async_side() -> None:
        async def main() -> None:
            async with open_store(shared_store_url) as store:

                async def work() -> bytes:
                    ran.append("async")
                    await asyncio.sleep(0.2)
                    return b"async"

                barrier.wait()
                results["async"] = (await Idempotency(store).run(key, "fp", work)).value

        asyncio.run(main())

    def sync_work() -> bytes:
        ran.append("sync")
        time.sleep(0.2)
        return b"sync"

    with idem_sync.Idempotency(shared_store_url) as idem:
        other = threading.Thread(target=async_side)
        other.start()
        barrier.wait()
        results["sync"] = idem.run(key, "fp", sync_work).value
        other.join()
    assert len(ran) == 1
    assert results["sync"] == results["async"] == ran[0].encode()


def test_decorated_sync_and_async_functions_of_one_name_share_records(
    shared_store_url: str,
) -> None:
    calls: list[str] = []

    def charge(order: str, amount: int) -> dict[str, object]:
        calls.append("sync")
        return {"order": order, "amount": amount}

    async def async_charge(order: str, amount: int) -> dict[str, object]:
        calls.append("async")
        return {"order": order, "amount": amount}

    async_charge.__qualname__ = charge.__qualname__
    order = new_key()
    with idem_sync.Idempotency(shared_store_url) as idem:
        first = idem.idempotent("order")(charge)(order, 5)

    async def replay() -> object:
        async with open_store(shared_store_url) as store:
            return await Idempotency(store).idempotent("order")(async_charge)(order, 5)

    assert asyncio.run(replay()) == first == {"order": order, "amount": 5}
    assert calls == ["sync"]


def test_work_runs_in_the_calling_thread_with_its_execution(
    runner: idem_sync.Idempotency,
) -> None:
    seen: dict[str, object] = {}

    def work() -> bytes:
        seen["thread"] = threading.current_thread()
        execution = current_execution()
        seen["fence"] = None if execution is None else execution.fence
        return b"ok"

    result = runner.run(new_key(), "fp", work)
    assert seen["thread"] is threading.current_thread()
    assert seen["fence"] == result.fence


def test_retry_replays_without_running_again(runner: idem_sync.Idempotency) -> None:
    key = new_key()
    calls: list[int] = []

    def work() -> bytes:
        calls.append(1)
        return b"once"

    first = runner.run(key, "fp", work)
    again = runner.run(key, "fp", work)
    assert (first.replayed, again.replayed) == (False, True)
    assert again.value == b"once"
    assert calls == [1]


def test_other_fingerprint_is_a_conflict(runner: idem_sync.Idempotency) -> None:
    key = new_key()
    runner.run(key, "fp", lambda: b"x")
    with pytest.raises(ConflictError):
        runner.run(key, "other", lambda: b"y")


def test_heartbeats_keep_a_long_call_s_lease(server_store_url: str) -> None:
    key = new_key()
    seen: list[object] = []
    with (
        idem_sync.Idempotency(server_store_url, lease_ttl=0.3) as holder,
        idem_sync.Idempotency(server_store_url, lease_ttl=0.3, in_flight="reject") as other,
    ):

        def work() -> bytes:
            # Three lease lengths: without heartbeats the key would be taken over.
            time.sleep(1.0)
            try:
                other.run(key, "fp", lambda: b"second run")
            except InProgressError as exc:
                seen.append(exc)
            return b"first"

        result = holder.run(key, "fp", work)
    assert result.value == b"first" and not result.takeover
    assert len(seen) == 1 and isinstance(seen[0], InProgressError)


def test_in_flight_reject_refuses_while_the_original_runs(server_store_url: str) -> None:
    key = new_key()
    started = threading.Event()
    finish = threading.Event()
    with (
        idem_sync.Idempotency(server_store_url) as holder,
        idem_sync.Idempotency(server_store_url, in_flight="reject") as rejecting,
    ):

        def work() -> bytes:
            started.set()
            finish.wait()
            return b"done"

        original = threading.Thread(target=holder.run, args=(key, "fp", work))
        original.start()
        started.wait()
        with pytest.raises(InProgressError):
            rejecting.run(key, "fp", lambda: b"never")
        finish.set()
        original.join()


def test_in_flight_wait_gets_the_original_s_result(runner: idem_sync.Idempotency) -> None:
    key = new_key()
    started = threading.Event()

    def work() -> bytes:
        started.set()
        time.sleep(0.2)
        return b"original"

    original = threading.Thread(target=runner.run, args=(key, "fp", work))
    original.start()
    started.wait()
    waited = runner.run(key, "fp", lambda: b"never")
    original.join()
    assert waited.replayed and waited.value == b"original"


def test_a_failure_releases_the_key_and_propagates_the_error(
    runner: idem_sync.Idempotency,
) -> None:
    key = new_key()
    boom = ValueError("card declined")

    def failing() -> bytes:
        raise boom

    with pytest.raises(ValueError) as raised:
        runner.run(key, "fp", failing)
    assert raised.value is boom
    assert runner.run(key, "fp", lambda: b"second try").value == b"second try"


def test_hold_on_failure_keeps_the_key_locked(server_store_url: str) -> None:
    key = new_key()

    def failing() -> bytes:
        raise ValueError("maybe half done")

    with idem_sync.Idempotency(server_store_url, on_failure="hold", in_flight="reject") as idem:
        with pytest.raises(ValueError):
            idem.run(key, "fp", failing)
        with pytest.raises(InProgressError):
            idem.run(key, "fp", lambda: b"must not run")


def test_keyboard_interrupt_in_the_work_releases_the_key(runner: idem_sync.Idempotency) -> None:
    key = new_key()

    def interrupted() -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run(key, "fp", interrupted)
    assert runner.run(key, "fp", lambda: b"after").value == b"after"


def _abandon_a_lease(url: str, key: str) -> None:
    """A holder that reserved ``key`` with a short lease and died without an outcome."""

    async def abandon() -> None:
        async with open_store(url) as store:
            await store.reserve(key, "fp", lease_ttl=0.05, retention=60)
        await asyncio.sleep(0.1)

    asyncio.run(abandon())


def test_takeover_refuse_raises_outcome_unknown(server_store_url: str) -> None:
    key = new_key()
    _abandon_a_lease(server_store_url, key)
    with idem_sync.Idempotency(server_store_url, on_takeover="refuse") as idem:
        with pytest.raises(OutcomeUnknownError):
            idem.run(key, "fp", lambda: b"must not run")
        with pytest.raises(OutcomeUnknownError):
            idem.run(key, "fp", lambda: b"must not run")


def test_takeover_run_runs_again_and_says_so(server_store_url: str) -> None:
    key = new_key()
    _abandon_a_lease(server_store_url, key)
    with idem_sync.Idempotency(server_store_url) as idem:
        result = idem.run(key, "fp", lambda: b"again")
    assert result.takeover and result.previous_fence == result.fence - 1


def test_work_returning_no_bytes_is_recorded_as_unrecordable(
    runner: idem_sync.Idempotency,
) -> None:
    key = new_key()
    calls: list[int] = []

    def text() -> bytes:
        calls.append(1)
        return "not bytes"  # type: ignore[return-value]

    for _ in range(2):
        with pytest.raises(UnrecordableResultError):
            runner.run(key, "fp", text)
    assert calls == [1]


def test_decorator_runs_a_plain_function_once_per_key(runner: idem_sync.Idempotency) -> None:
    calls: list[str] = []

    @runner.idempotent("order")
    def charge(order: str, amount: int) -> dict[str, object]:
        calls.append(order)
        return {"order": order, "charged": amount}

    order = new_key()
    assert charge(order, 3) == charge(order, 3) == {"order": order, "charged": 3}
    assert calls == [order]
    assert charge(None, 1) == {"order": None, "charged": 1}  # type: ignore[arg-type]
    assert calls == [order, None]


def test_async_work_is_refused_before_anything_runs(runner: idem_sync.Idempotency) -> None:
    async def charge() -> bytes:
        return b""

    with pytest.raises(TypeError, match=r"idemstore\.Idempotency"):
        runner.run(new_key(), "fp", charge)
    with pytest.raises(TypeError, match="async def"):
        runner.idempotent("order")(charge)


def test_async_decorator_refuses_a_plain_function_and_points_to_sync() -> None:
    async def build() -> None:
        async with open_store("memory://") as store:

            def plain(order: str) -> int:
                return 1

            Idempotency(store).idempotent("order")(plain)

    with pytest.raises(TypeError, match=r"idemstore\.sync"):
        asyncio.run(build())


def test_misspelt_options_are_named_by_the_constructor_and_the_decorator(
    runner: idem_sync.Idempotency,
) -> None:
    with pytest.raises(TypeError, match=r"Idempotency\(\) got unknown options \['lease'\]"):
        idem_sync.Idempotency("memory://", lease=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"idempotent\(\) got unknown options \['scpoe'\]"):
        runner.idempotent("order", scpoe="tenant")  # type: ignore[call-arg]


def test_a_bad_url_fails_in_the_constructor() -> None:
    with pytest.raises(ConfigurationError, match="unknown store scheme"):
        idem_sync.Idempotency("nosuch://here")


def test_a_bad_option_fails_in_the_constructor(server_store_url: str) -> None:
    with pytest.raises(ConfigurationError):
        idem_sync.Idempotency(server_store_url, on_failure="explode")  # type: ignore[arg-type]


def test_close_is_idempotent_and_later_calls_are_refused(server_store_url: str) -> None:
    idem = idem_sync.Idempotency(server_store_url)
    with idem:
        idem.run(new_key(), "fp", lambda: b"x")
    idem.close()
    with pytest.raises(RuntimeError, match="closed"):
        idem.run(new_key(), "fp", lambda: b"x")
    assert not any(t.name == "idemstore-sync" and t.is_alive() for t in threading.enumerate())


def _in_forked_child(
    idem: idem_sync.Idempotency, charge: Callable[[str], str], key: str, out: Any
) -> None:
    try:
        value = idem.run(key, "fp", lambda: b"from the child").value
        order = f"{key}-order"
        out.put((value, charge(order), charge(order)))
    except BaseException as exc:
        out.put(repr(exc))


def test_a_runner_built_before_a_fork_works_in_the_child(shared_store_url: str) -> None:
    key = new_key()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    with idem_sync.Idempotency(shared_store_url) as idem:
        idem.run(new_key(), "fp", lambda: b"the parent's connections are in use")

        @idem.idempotent("order")
        def charge(order: str) -> str:
            return f"charged {order}"

        child = context.Process(target=_in_forked_child, args=(idem, charge, key, out))
        child.start()
        answer = out.get(timeout=60)
        child.join()
        # The parent's runner still works, and sees what the child recorded.
        replayed = idem.run(key, "fp", lambda: b"not again")
    assert answer == (b"from the child", f"charged {key}-order", f"charged {key}-order")
    assert replayed.replayed and replayed.value == b"from the child"


def test_key_and_scope_functions_run_in_the_calling_thread(
    runner: idem_sync.Idempotency,
) -> None:
    local = threading.local()
    local.tenant = "acme"
    order = new_key()

    @runner.idempotent(lambda amount: f"{local.tenant}:{order}", scope=lambda amount: local.tenant)
    def charge(amount: int) -> int:
        return amount

    assert charge(5) == 5
    local.tenant = "other"
    assert charge(5) == 5  # another tenant: its own key, not a conflict


def test_the_sync_decorator_leaves_excluded_fields_out_and_conflicts_on_the_rest(
    runner: idem_sync.Idempotency,
) -> None:
    charges: list[int] = []

    @runner.idempotent(key="order_id", fingerprint_exclude=["/meta/sent_at"])
    def charge(order_id: str, amount: int, meta: dict[str, int]) -> int:
        charges.append(amount)
        return len(charges)

    key = new_key()
    assert charge(key, 10, {"sent_at": 1}) == 1
    assert charge(key, 10, {"sent_at": 2}) == 1
    with pytest.raises(ConflictError):
        charge(key, 20, {"sent_at": 2})
    assert charges == [10]


def test_the_sync_decorator_refuses_a_pointer_to_no_argument(
    runner: idem_sync.Idempotency,
) -> None:
    with pytest.raises(ConfigurationError, match="no argument named 'amount'"):

        @runner.idempotent(key="order_id", fingerprint_include=["/amount"])
        def charge(order_id: str) -> None:
            pass
