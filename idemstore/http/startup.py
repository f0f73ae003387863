"""The ASGI middleware's startup check, on the lifespan protocol: when the server sends
``lifespan.startup``, the store is checked (``idemstore.backends.startup.check_at_startup``)
before the app starts; a missing schema turns the app's ``lifespan.startup.complete`` into
``lifespan.startup.failed`` with the error's message (which names the ``?schema=`` it looked
in and the migrate command), so the server refuses to start instead of answering 500 to the
first keyed request. A server or app without lifespan skips it: the first keyed request then
finds the schema, as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from idemstore.backends.startup import check_at_startup
from idemstore.errors import SchemaError

if TYPE_CHECKING:
    from idemstore.http.wire import Message, Receive, Send
    from idemstore.protocol import IdempotencyStore

__all__ = ["checking_startup"]


def checking_startup(
    store: IdempotencyStore, receive: Receive, send: Send, *, door: str
) -> tuple[Receive, Send]:
    """``receive`` and ``send`` of a lifespan scope, checking ``store`` at startup."""
    failed: list[str] = []

    async def receiving() -> Message:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await check_at_startup(store, door=door)
            except SchemaError as exc:
                failed.append(str(exc))
        return message

    async def sending(message: Message) -> None:
        if failed and message["type"] == "lifespan.startup.complete":
            message = {"type": "lifespan.startup.failed", "message": failed[0]}
        await send(message)

    return receiving, sending
