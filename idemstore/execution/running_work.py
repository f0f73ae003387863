"""Which execution the running work belongs to, and what the execution path accepts as work.

Part of the execution path (``idemstore.execution`` re-exports ``current_execution``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.execution.state_machine import Execution

__all__ = ["current_execution", "refuse_plain_function", "running"]

_CURRENT: contextvars.ContextVar[Execution | None] = contextvars.ContextVar(
    "idemstore_current_execution", default=None
)


def current_execution() -> Execution | None:
    """The ``Execution`` whose work is running in this context, or ``None``.

    Set while ``Idempotency.run``/``ExecutionPolicy.run`` and ``@idempotent`` run the work
    (and so in the tasks it starts): the work can ask whether it is a takeover
    (``takeover``, ``previous_fence``) or which fence it runs under.
    """
    return _CURRENT.get()


@contextlib.contextmanager
def running(execution: Execution) -> Iterator[None]:
    """Make ``execution`` the ``current_execution()`` for the ``with`` block."""
    token = _CURRENT.set(execution)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def refuse_plain_function(work: object, what: str = "work") -> None:
    """``TypeError`` for a ``def`` function (or a partial or method of one) that is no
    ``async def``: before anything is reserved or run.

    A lambda or another callable may still return an awaitable (``lambda: charge(args)``
    with ``charge`` async is the usual form); what it returns is only known by calling it.
    """
    target = work
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)  # a bound method
    if not callable(work):
        raise TypeError(f"{what} must be an async function, not {type(work).__name__}")
    if (
        inspect.isfunction(target)
        and target.__name__ != "<lambda>"
        and not inspect.iscoroutinefunction(target)
    ):
        raise TypeError(
            f"{what} {target.__qualname__} is a plain function: define it with `async def` (a"
            " zero-argument callable returning an awaitable, such as `lambda: charge(args)`"
            " with an async charge, works too). Nothing was reserved or run"
        )
