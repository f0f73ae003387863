"""Celery: run a task's side effect once per key, however often the task is delivered.

Celery delivers a task at least once: a retry, a broker redelivery after a worker died
(``acks_late``), a producer that sent twice. ``idempotent_task(idem)`` makes the task body
a ``idemstore.sync`` call under a key, the task id by default::

    idem = idemstore.sync.Idempotency("redis://localhost:6379/0")

    @app.task(acks_late=True)
    @idempotent_task(idem)
    def charge(order_id: str, amount: int) -> dict: ...

A second delivery of a task that completed returns the recorded result without running the
body; one that arrives while the first still runs waits for it (``in_flight="wait"``, the
runner's default); one redelivered after its worker was killed mid-run takes the key over
when the dead worker's lease lapses, and then runs the body again (``on_takeover="run"``,
``current_execution().takeover`` says so) or raises ``OutcomeUnknownError``
(``on_takeover="refuse"``: never a second run). A body that raises releases the key (the
runner's ``on_failure``), so Celery's own retry runs it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemstore.errors import InvalidKeyError, MissingDependencyError

try:
    from celery import current_task
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.celery needs Celery: pip install 'idemstore[celery]'"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from idemstore.sync import Idempotency

__all__ = ["idempotent_task", "task_id"]

P = ParamSpec("P")
T = TypeVar("T")


def task_id(*args: Any, **kwargs: Any) -> str:
    """The key of the running task by default: its id, the same on every delivery."""
    request = getattr(current_task, "request", None)
    identifier = getattr(request, "id", None)
    if not identifier:
        raise InvalidKeyError(
            "idempotent_task keys a task by its id, and no Celery task is running: call the"
            " task through Celery (delay/apply_async), or give key= a function of its arguments"
        )
    return str(identifier)


def idempotent_task(
    idem: Idempotency,
    *,
    key: Callable[..., str] | None = None,
    scope: str = "celery",
    fingerprint_exclude: Iterable[str] | None = None,
    fingerprint_include: Iterable[str] | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a task's function (below ``@app.task``) so it runs once per key.

    Args:
        idem: the synchronous runner (its store, its policies).
        key: a function of the task's arguments returning the key (for producers that may
            send one operation as several tasks); default: the task id (``task_id``).
        scope: the records' scope (default ``"celery"``).
        fingerprint_exclude, fingerprint_include: arguments (or fields in them) the
            fingerprint leaves out or is limited to, as JSON pointers (``"/sent_at"``): the
            ``@idempotent`` decorator's options.

    The fingerprint covers the function's qualified name and its arguments, which must be
    JSON values (so a bound task's ``self`` cannot be one of them: use ``bind=False``). The
    result is recorded by the runner's serializer (JSON values, dataclasses, pydantic models).
    """
    return idem.idempotent(
        task_id if key is None else key,
        scope=scope,
        require_key=True,
        fingerprint_exclude=fingerprint_exclude,
        fingerprint_include=fingerprint_include,
    )
