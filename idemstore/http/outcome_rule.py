"""What the end of a keyed response leaves under its key: the outcome rule of the HTTP doors.

The rule is the runner's: work that ran is never run again under its key. A response within
the recording limit is recorded and replayed. One that ran but cannot be recorded (larger than
``max_response_bytes``, or with parts a record cannot hold: trailers, an extension's message)
leaves the key with the *outcome not recorded* marker, and every retry gets the shared refusal
(409 ``outcome_unrecorded``, docs/refusals.md), unless the door's ``on_unrecorded="run"``
opts into releasing the key instead (a retry then runs the request again). A 5xx is the
server's failure, released unless ``record_server_errors``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from idemstore.errors import ConfigurationError, IdemstoreError
from idemstore.http.recording import Captured

if TYPE_CHECKING:
    from idemstore.execution import Execution
    from idemstore.http.live import LiveResponse

__all__ = ["UnrecordedPolicy", "check_unrecorded", "settle_response"]

logger = logging.getLogger("idemstore.http.asgi")

UnrecordedPolicy = Literal["refuse", "run"]


def check_unrecorded(value: object) -> UnrecordedPolicy:
    if value == "refuse":
        return "refuse"
    if value == "run":
        return "run"
    raise ConfigurationError(
        f'on_unrecorded must be "refuse" (the default: retries get 409 "Outcome not recorded")'
        f' or "run" (release the key: a retry runs the request again), not {value!r}'
    )


async def settle_response(
    execution: Execution,
    live: LiveResponse,
    *,
    record_server_errors: bool,
    on_unrecorded: UnrecordedPolicy,
) -> None:
    """Settle ``execution`` with the complete response ``live`` (before its end is sent)."""
    if live.status >= 500 and not record_server_errors:
        await execution.release()
        return
    why = live.unrecordable
    if live.overflowed:
        why = f"larger than {live.limit} bytes ({live.size} bytes)"
    if why:
        if on_unrecorded == "run":
            logger.warning(
                "response under Idempotency-Key %r was %s: sent but not recorded, key released"
                ' (on_unrecorded="run": a retry runs the request again)',
                execution.key,
                why,
            )
            await execution.release()
        elif live.overflowed:
            await execution.settle_too_large(live.size, live.limit)
        else:
            await execution.settle_unrecordable(f"the response is {why}")
        return
    try:
        await execution.settle(Captured(live.status, live.headers, live.body).encode())
    except IdemstoreError as exc:
        logger.warning(
            "response under Idempotency-Key %r could not be recorded: %s", execution.key, exc
        )
