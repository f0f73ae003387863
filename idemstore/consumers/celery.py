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

Keyed by the task id, the function is keyed by *its own* delivery only: called directly (or
with ``task.run(...)``) inside another running task, it would find that task's id, and every
such call in that task would share one record (the second call with other arguments a
``ConflictError``, a third like the first silently replayed). Such a call is refused with
``InvalidKeyError``: send it as a task of its own (``delay``/``apply_async``), or give
``key=`` a function of its arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemstore.errors import InvalidKeyError, MissingDependencyError
from idemstore.install_lines import install_hint

try:
    from celery import current_task
except ImportError as exc:
    raise MissingDependencyError(
        "idemstore.consumers.celery needs Celery: " + install_hint("celery")
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from idemstore.sync import Idempotency

__all__ = ["idempotent_task", "task_id"]

P = ParamSpec("P")
T = TypeVar("T")


def task_id(*args: Any, **kwargs: Any) -> str:
    """The id of the running task, the same on every delivery (``idempotent_task``'s default
    key also checks that the running task is the decorated function's own)."""
    request = getattr(current_task, "request", None)
    identifier = getattr(request, "id", None)
    if not identifier:
        raise InvalidKeyError(
            "idempotent_task keys a task by its id, and no Celery task is running: call the"
            " task through Celery (delay/apply_async), or give key= a function of its arguments"
        )
    return str(identifier)


def _runs(run: object, function: object) -> bool:
    """Whether a task's ``run`` is ``function`` (through decorators that say what they wrap)."""
    found = getattr(run, "__func__", run)  # a bound task's run is a method
    for _ in range(32):
        if found is function:
            return True
        found = getattr(found, "__wrapped__", None)
        if found is None:
            return False
    return False


def _own_task_id(decorated: Callable[[], object], name: str) -> Callable[..., str]:
    """The default key of the function ``decorated()`` returns: the id of the task running
    it, refused when the running task is another one (a call inside that task's body)."""

    def key(*args: Any, **kwargs: Any) -> str:
        identifier = task_id()
        if not _runs(getattr(current_task, "run", None), decorated()):
            running = getattr(current_task, "name", "another task")
            raise InvalidKeyError(
                f"{name} was called inside task {running} ({identifier}), not delivered as a"
                f" task of its own: keyed by that task's id, every such call would share one"
                f" record. Send it as a task (delay/apply_async), or give idempotent_task key="
                f" a function of its arguments"
            )
        return identifier

    return key


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
    By the task id, a call of the function that is not its task's own delivery (inside
    another task) is refused with ``InvalidKeyError`` (see the module docstring).
    """
    options: dict[str, Any] = {
        "scope": scope,
        "require_key": True,
        "fingerprint_exclude": fingerprint_exclude,
        "fingerprint_include": fingerprint_include,
    }
    if key is not None and key is not task_id:
        return idem.idempotent(key, **options)

    def decorate(func: Callable[P, T]) -> Callable[P, T]:
        decorated: list[Callable[P, T]] = []
        by_id = _own_task_id(lambda: decorated[0], func.__qualname__)
        decorated.append(idem.idempotent(by_id, **options)(func))
        return decorated[0]

    return decorate
