"""Tasks that run their first step at once, where the running Python allows it.

A task made by ``asyncio.create_task`` waits for the next turn of the event loop before it
runs at all; on a path that starts a task per call (the shielded store operations of
``idemstore.execution``, the MCP relay's call tasks) those turns are most of the latency a
store that answers from memory adds. Python 3.12's ``asyncio.eager_task_factory`` runs the
coroutine in the caller's turn until it first suspends, as a real task (its own context and
``current_task``); a coroutine that never suspends is done when ``start_task`` returns. On
Python 3.11, and on a loop with a task factory of the application's, ``start_task`` is
``loop.create_task``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

__all__ = ["EAGER", "start_task"]

T = TypeVar("T")

_factory: Callable[..., asyncio.Task[Any]] | None = getattr(asyncio, "eager_task_factory", None)

EAGER = _factory is not None
"""Whether ``start_task`` runs a task's first step at once (Python 3.12 and later, on a loop
without a task factory of the application's)."""


def start_task(
    coroutine: Coroutine[Any, Any, T],
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    name: str | None = None,
) -> asyncio.Task[T]:
    """A task running ``coroutine``, started in this turn where Python allows it.

    The caller must not assume either way: the task may already be done (check ``done()``)
    or not yet have run a single line.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    if _factory is None or loop.get_task_factory() is not None:
        # An application's own task factory (context propagation, instrumentation) wins.
        return loop.create_task(coroutine, name=name)
    task: asyncio.Task[T] = _factory(loop, coroutine, name=name)
    return task
