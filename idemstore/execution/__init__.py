"""The execution path every consumer takes: begin, then replay or execute and settle.

Every consumer of idemstore (the ``Idempotency`` runner, the ASGI middleware, the MCP proxy
and the MCP server adapters) runs a keyed piece of work through this module and nothing else
touches ``reserve`` / ``wait`` / ``extend`` / ``complete`` / ``release`` for it::

    policy = ExecutionPolicy(store, in_flight="reject")
    claim = await policy.begin(key, fingerprint, scope=scope)  # ConflictError, InProgressError
    if isinstance(claim, Replay):
        return claim.response                    # the recorded outcome
    async with claim:                            # an Execution: this caller owns the key
        response = await do_the_work()
        await claim.settle(response)             # recorded; retries replay it from now on

Public API (what callers may rely on):

``ExecutionPolicy(store, *, lease_ttl=30, retention=86400, in_flight="wait",
wait_timeout=None, on_failure="release", on_takeover="run", max_response_bytes=None)``
    The choices that differ between consumers; each is described on the class.

``await policy.begin(key, fingerprint, *, scope="") -> Execution | Replay``
    Reserve the key: a ``Replay`` of the recorded outcome, or an ``Execution`` this caller
    owns (its lease is kept alive from this moment). Raises ``ConflictError`` (other
    fingerprint), ``InProgressError`` (held by another caller and the policy is not to wait,
    or the wait timed out), ``LeaseLostError`` (the store's reply granting the lease came
    after the lease could have lapsed, by this process's monotonic clock: nothing started,
    the key was released), ``OutcomeUnknownError`` (a takeover under ``"refuse"``: nothing
    runs, and the key records that its outcome is unknown, so retries get this error too),
    the error of a key whose work ran but left no recordable outcome (``OutcomeTooLargeError``,
    ``UnrecordableResultError``: never a second run), or the store's error. Cancel-safe: a
    ``reserve`` that completes after the caller was cancelled is released before the
    cancellation propagates (so the cancellation takes as long as that reserve, which the
    store's timeouts bound; a second cancellation stops waiting for it, and the release still
    happens), and no lease is left that nobody owns. An ``Execution`` keeps its key alive
    until it is settled, released or failed: enter its ``async with`` block (or hand it to
    whoever settles it) right away.

``await policy.run(key, fingerprint, work, *, scope="") -> Result``
    ``begin`` plus the simplest execution: ``work()`` returns an awaitable of the bytes to
    record, run with ``current_execution()`` set. A plain ``def`` is refused before
    reserving; work that returns no awaitable or no bytes ran, so the key records that and
    this call and its retries raise ``UnrecordableResultError`` (a ``TypeError``).

``Execution``: one owned execution of the work (a lease, kept alive by a ``LeaseKeeper``).
    It is not bound to the task that began it: a consumer may stop waiting for the work (a
    client cancelled, the answer comes on another stream) and settle it later from any task;
    the lease stays alive until then (detaching is simply keeping the object).

    - ``await settle(response) -> bool``: record ``response`` as the outcome, now, even while
      the work goes on (early settlement: an HTTP response is final when its last body
      message is sent, background tasks may still run). ``True`` when stored; ``False`` when
      the lease was lost to a takeover or the response is too large (then the key records
      its size, and retries get ``OutcomeTooLargeError``). Store errors propagate. Shielded:
      a cancellation of the caller cannot cut it short (the cancellation still propagates).
      ``settle(response, connection=conn)``: inside ``conn``'s open transaction, on a SQL
      store of the same database; ``LeaseLostError`` if fenced out (see
      ``idemstore.execution.settling``).
    - ``await settle_unrecordable(why) -> UnrecordableResultError``: the work ran but its
      result cannot be recorded; record that instead and return the error to raise.
    - ``await release()``: give the key up without recording (a retry runs again). Quiet:
      a store error is logged, not raised. Shielded.
    - ``await fail(error)``: apply the policy's ``on_failure`` to ``error``. Shielded, and
      quiet like ``release`` (a store error while recording the error is logged).
    - ``async with execution:`` exiting with an exception (a cancellation included) applies
      ``fail``; exiting normally without settling releases the key (nothing recorded). Once
      settled (or released), later exceptions are the consumer's, not the request's: they
      propagate but change nothing in the store.
    - ``settled``, ``finished`` (settled, released or held), ``lease`` (the latest),
      ``fence``, ``key``, ``scope``, ``lapsed`` (a heartbeat found the lease lapsed),
      ``takeover`` and ``previous_fence`` (the holder taken over from, or ``None``);
      ``await checkpoint(name, data)`` and ``checkpoints``: ``idemstore.execution.recovery_points``;
      ``policy`` (the ``ExecutionPolicy`` that began it).
    - The transitions the execution path's own helpers drive (``idemstore.execution.settling``,
      ``ExecutionPolicy.begin``): ``check_running()``, ``await start_committing()`` (running →
      committing, returns the lease), ``await fenced_out()`` (committing → released),
      ``observe(observation)``. Nothing outside ``Execution`` reads or writes its state.

``Replay``: ``response`` (the recorded bytes), ``fence``, ``record``.

``Result``: what ``run`` returns: ``value``, ``replayed``, ``fence``, ``takeover``,
``previous_fence``.

``current_execution()``: the ``Execution`` whose work runs in this context, or ``None``.

``LeaseKeeper``: the heartbeat, for a consumer that holds a lease of its own (see
``idemstore.execution.lease_keeping``). Markers: ``idemstore.execution.outcome_markers``.

The package's rooms: ``policy`` (``ExecutionPolicy``, ``begin``, ``run``), ``state_machine``
(``Execution``, the one owner of an execution's state), ``settling`` (in the caller's
transaction), ``recovery_points``, ``lease_keeping`` (the heartbeat and shielded calls),
``running_work`` (``current_execution``), ``outcome_markers``, ``refusals`` (what a refusal
means to every door), ``hooks`` (what an observer sees) and ``eager_tasks``. Import the names
above from ``idemstore.execution`` (or ``idemstore``); the modules are the package's own.
"""

from __future__ import annotations

from idemstore.execution.lease_keeping import LeaseKeeper
from idemstore.execution.policy import (
    ExecutionPolicy,
    FailurePolicy,
    Replay,
    Result,
    TakeoverPolicy,
)
from idemstore.execution.running_work import current_execution
from idemstore.execution.state_machine import Execution

__all__ = [
    "Execution",
    "ExecutionPolicy",
    "FailurePolicy",
    "LeaseKeeper",
    "Replay",
    "Result",
    "TakeoverPolicy",
    "current_execution",
]
