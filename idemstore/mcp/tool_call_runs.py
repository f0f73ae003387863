"""Running one keyed ``tools/call`` through the execution path, for any relay.

``CallRunner.answer(pending, exchange)`` reserves the call's key (``idemstore.execution``) and
either answers without the server (a replay, or a refusal from the one refusal table,
``idemstore.mcp.refusal_errors``) or forwards the call once through ``exchange`` and records
what ``idemstore.mcp.outcome_policy`` says to record. The same in two steps, for a relay that
forwards in its own step: ``claim_at_once(pending)`` (never waits for a call in flight: it
answers ``HELD`` instead), then ``finish(call, execution, answer)`` once the call is sent.
``CallRunner.cancel_forwarded`` applies a
client's cancellation to a call the server already has: a derived or ``_meta`` key is released
at once, a SEP key is held until the server answers or ``cancel_grace`` passes.

The runner keeps no per-connection state: a relay holds its ``PendingCall`` objects (the stdio
proxy by request id, the gateway by caller, session and request id).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from idemstore.errors import InProgressError
from idemstore.execution import Execution, ExecutionPolicy, Replay
from idemstore.execution.refusals import Refusal, refusal_of
from idemstore.mcp import json_splice, sep3182
from idemstore.mcp.outcome_policy import KeyKind, decide
from idemstore.mcp.refusal_errors import refusal_error
from idemstore.mcp.tool_call_keys import dumps, error_line

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from idemstore.mcp.relay_options import RelayOptions
    from idemstore.mcp.tool_call_keys import ToolCall
    from idemstore.protocol import IdempotencyStore

    Exchange = Callable[[bytes], Awaitable["ServerResponse"]]
    AdmitReplay = Callable[[], Awaitable[bool]]

__all__ = ["HELD", "CallRunner", "PendingCall", "ServerGone", "ServerResponse", "server_exited"]

logger = logging.getLogger("idemstore.mcp.tool_calls")


class ServerGone(Exception):
    """Raised by an exchange: the server cannot answer (it exited, or its input is closed)."""


@dataclass(frozen=True, slots=True)
class ServerResponse:
    """The server's final response to a forwarded call: parsed, and its own bytes.

    ``relayed``: the relay has sent ``line`` to the client already (it may, when the store
    answers inline: ``ToolCallCore.relays_first``), so the call sends nothing more.
    """

    message: dict[str, Any]
    line: bytes
    relayed: bool = False


@dataclass(slots=True)
class PendingCall:
    """A started call, from its reserve until its answer."""

    call: ToolCall
    task: asyncio.Task[bytes | None] | None = None
    forwarded: bool = False
    execution: Execution | None = None
    cancelled: bool = False
    sent: bool = False  # forwarded, or answered
    # Made only when wait_sent() has to wait: most calls are sent before anyone asks.
    sent_event: asyncio.Event | None = None

    def mark_sent(self) -> None:
        self.sent = True
        if self.sent_event is not None:
            self.sent_event.set()

    def wait_sent(self) -> Coroutine[Any, Any, Literal[True]]:
        if self.sent_event is None:
            self.sent_event = asyncio.Event()
            if self.sent:
                self.sent_event.set()
        return self.sent_event.wait()


class _Held:
    """``CallRunner.claim_at_once``'s answer for a key held by a call in flight that this
    call's policy waits for."""

    __slots__ = ()


HELD = _Held()


def server_exited(request_id: object) -> bytes:
    """The answer to a call whose server went away before answering."""
    why = "the MCP server exited before answering; the call may or may not have run"
    return error_line(request_id, sep3182.error(sep3182.INTERNAL_ERROR, why, sep3182.SERVER_EXITED))


def _replay_line(request_id: object, stored: bytes) -> bytes:
    # The retry's own id and the replay marker spliced into the recorded bytes (json_splice).
    try:
        return json_splice.replay_line(dumps(request_id), stored, sep3182.REPLAYED_META_KEY)
    except ValueError as exc:
        logger.error("a recorded outcome is unreadable: %s", exc)
        why = "the recorded outcome of this idempotency key is unreadable"
        return error_line(request_id, sep3182.error(sep3182.INTERNAL_ERROR, why))


def _outcome(response: ServerResponse, kind: KeyKind) -> bytes | None:
    """The bytes to record for a server response, or ``None`` when the key must be released."""
    if decide(response.message, kind) == "release":
        return None
    try:
        return json_splice.recorded(response.line)  # the server's bytes: replays stay exact
    except ValueError as exc:
        logger.warning("response not recorded, its bytes are not one JSON object: %s", exc)
        return None


class CallRunner:
    """The execution of keyed calls over ``store`` under ``options`` (``consumer`` names the
    relay in telemetry)."""

    __slots__ = ("_at_once", "_cancel_grace", "_policy", "_sep_policy")

    def __init__(self, store: IdempotencyStore, options: RelayOptions, consumer: str) -> None:
        def policy(retention: float, in_flight: Literal["wait", "reject"]) -> ExecutionPolicy:
            return ExecutionPolicy(
                store,
                lease_ttl=options.lease_ttl,
                retention=retention,
                in_flight=in_flight,
                on_takeover=options.on_takeover,
                consumer=consumer,
            )

        self._policy = policy(options.retention, options.in_flight)
        # SEP-3182: a duplicate while the original runs is refused.
        self._sep_policy = policy(options.sep_retention, "reject")
        self._cancel_grace = options.cancel_grace
        # The same policy, refusing a key in flight instead of waiting for it: a relay's
        # first try at a call in its own step (claim_at_once), where it must not wait.
        self._at_once = self._policy
        if options.in_flight != "reject":
            self._at_once = policy(options.retention, "reject")

    async def answer(
        self, pending: PendingCall, exchange: Exchange, admit_replay: AdmitReplay | None = None
    ) -> bytes | None:
        """What to send the client for ``pending`` (``None``: nothing; ``admit_replay`` said
        no and the relay answered itself)."""
        call = pending.call
        try:
            policy = self._sep_policy if call.kind == "sep" else self._policy
            claim = await self._claim(pending, policy, admit_replay, waits=False)
            if isinstance(claim, Execution):
                return await self.finish(call, claim, exchange(call.forward))
            assert not isinstance(claim, _Held)  # a policy that waits never answers HELD
            return claim
        finally:
            pending.mark_sent()

    async def claim_at_once(self, pending: PendingCall) -> bytes | Execution | _Held:
        """``answer``'s first step without ever waiting for a call in flight: the line to
        answer with (a replay, a refusal), the ``Execution`` to forward under (``pending`` is
        then marked forwarded), or ``HELD`` when the key is held by a call this call's policy
        waits for (run it with ``answer`` then, in a task of its own)."""
        call = pending.call
        if call.kind == "sep":  # SEP-3182 refuses a duplicate in flight: nothing to wait for
            claim = await self._claim(pending, self._sep_policy, None, waits=False)
        else:
            waits = self._at_once is not self._policy
            claim = await self._claim(pending, self._at_once, None, waits=waits)
        assert claim is not None  # only a refused replay answers nothing
        return claim

    async def _claim(
        self,
        pending: PendingCall,
        policy: ExecutionPolicy,
        admit_replay: AdmitReplay | None,
        *,
        waits: bool,
    ) -> bytes | Execution | _Held | None:
        call = pending.call
        try:
            claim = await policy.begin(call.key, call.fingerprint, scope=call.scope)
        except InProgressError as exc:
            if waits:
                return HELD
            return self._refused(call, exc)
        except Exception as exc:
            return self._refused(call, exc)
        if isinstance(claim, Replay):
            if admit_replay is not None and not await admit_replay():
                logger.info("replay of %s key %r refused by the relay", call.kind, call.key)
                return None
            logger.info("replayed %s key %r (fence %d)", call.kind, call.key, claim.fence)
            return _replay_line(call.request_id, claim.response)
        # From here on a client's cancellation never cancels this call's task (see
        # cancel_forwarded): the execution stays owned, its lease kept alive, while the
        # server works.
        pending.execution = claim
        pending.forwarded = True
        pending.mark_sent()
        return claim

    @staticmethod
    def _refused(call: ToolCall, exc: Exception) -> bytes:
        # Fail closed: what is no refusal of the table is a store that cannot answer, and
        # without it the relay cannot tell a retry from a first call.
        refusal = refusal_of(exc) or Refusal.STORE_UNAVAILABLE
        if refusal.retryable or refusal is Refusal.SCHEMA_MISSING:
            logger.error("idempotency store refused %s key %r: %s", call.kind, call.key, exc)
        return error_line(call.request_id, refusal_error(refusal, call.key, str(exc), exc))

    async def finish(
        self, call: ToolCall, execution: Execution, answer: Awaitable[ServerResponse]
    ) -> bytes | None:
        """Await the server's ``answer`` to the forwarded call and record (or release) its
        outcome: the line to send the client (``None`` when the relay sent it already)."""
        try:
            response = await answer
        except ServerGone:
            return await self.gone(call, execution)
        except BaseException:
            if not execution.finished:
                await execution.release()
            raise
        if not execution.finished:
            stored = _outcome(response, call.kind)
            if stored is None:
                await execution.release()
            else:
                try:
                    if not await execution.settle(stored):
                        logger.warning("outcome of key %r was not stored", call.key)
                except Exception:
                    # The server answered: its caller gets the answer even though the
                    # store failed; a retry after the lease lapses runs again.
                    logger.warning(
                        "could not record the outcome of key %r", call.key, exc_info=True
                    )
        return None if response.relayed else response.line

    @staticmethod
    async def gone(call: ToolCall, execution: Execution) -> bytes:
        """The server went away before answering the forwarded call: its key is released;
        the line to send the client."""
        if not execution.finished:
            await execution.release()
        return server_exited(call.request_id)

    def cancel_forwarded(self, pending: PendingCall) -> None:
        """A client cancelled ``pending``, which the server has: release a derived or
        ``_meta`` key now; stop keeping any key after ``cancel_grace`` without an answer."""
        if pending.cancelled or pending.task is None:
            return
        pending.cancelled = True
        call = pending.call
        if call.kind == "sep":
            logger.info(
                "call with SEP key %r cancelled: its key stays held while in flight", call.key
            )
        elif pending.execution is not None and not pending.execution.finished:
            _spawn(pending.execution.release(), f"release {call.key!r}")
            logger.info("released %s key %r: the client cancelled the call", call.kind, call.key)
        loop = asyncio.get_running_loop()
        loop.call_later(self._cancel_grace, _give_up, pending.task)


def _give_up(task: asyncio.Task[bytes | None]) -> None:
    # A cancelled call the server never answered (MCP servers need not): stop keeping it.
    if not task.done():
        task.cancel()


_BACKGROUND: set[asyncio.Task[None]] = set()


def _spawn(coroutine: Awaitable[None], what: str) -> None:
    async def run() -> None:
        try:
            await coroutine
        except Exception:
            logger.warning("could not %s", what, exc_info=True)

    task = asyncio.ensure_future(run())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
