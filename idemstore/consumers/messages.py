"""Messages as the consumer door sees them, whatever the broker, and how each is keyed and
fingerprinted (shared by the async door and the Lambda handlers)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from idemstore import CanonicalizationError, InvalidKeyError, fingerprint
from idemstore.fingerprint_fields import field_selection

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "UNKEYABLE",
    "KeySource",
    "Message",
    "MessageKeying",
    "attribute",
    "body_pointer",
    "message_id",
]


@dataclass(frozen=True, slots=True)
class Message:
    """One message as the door sees it, whatever the broker.

    ``id``: the broker's id for the message, the same on every redelivery (SQS
    ``MessageId``; ``stream:entry-id`` for Redis Streams; the AMQP ``message_id``; the
    ``Nats-Msg-Id`` header or ``stream:sequence`` for JetStream). ``attributes``: message
    attributes or headers, as text. ``redelivered``: whether the broker says it delivered
    this message before; ``delivery_count`` when it counts. ``raw``: the driver's object.
    """

    id: str
    body: bytes
    attributes: Mapping[str, str] = field(default_factory=dict)
    redelivered: bool = False
    delivery_count: int | None = None
    raw: Any = None

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return json.loads(self.body)


KeySource: TypeAlias = "Callable[[Message], str | None]"
"""What ``ConsumerDoor(key=...)`` takes: a function of the message returning its key."""


def message_id(message: Message) -> str | None:
    """The default key: the broker's message id, the same on every redelivery (``None``,
    so dead-lettered, for a message that has none: an AMQP message without ``message_id``)."""
    return message.id or None


def body_pointer(pointer: str) -> Callable[[Message], str | None]:
    """A key read from the JSON body at ``pointer`` (RFC 6901, ``"/order/id"``), for
    producers that may send one business event as two messages. A body that is no JSON, or
    has nothing there, has no key (the message is dead-lettered)."""
    selection = field_selection([pointer], None)
    assert selection is not None

    def key(message: Message) -> str | None:
        try:
            document = message.json()
        except ValueError:
            return None
        found = selection.apply(document)["include"][pointer]
        if not found or found[0] is None:
            return None
        value = found[0]
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    return key


def attribute(name: str) -> Callable[[Message], str | None]:
    """A key read from the message attribute or header ``name`` (case-insensitive)."""
    wanted = name.lower()

    def key(message: Message) -> str | None:
        for found, value in message.attributes.items():
            if found.lower() == wanted:
                return value
        return None

    return key


class MessageKeying:
    """How a message is keyed and fingerprinted: shared by the async door and the Lambda
    handlers, so a message gets the same record through either.

    ``key(message)``: the key (``InvalidKeyError`` when the key source finds none);
    ``fingerprint(message)``: the body's SHA-256, or the canonical fingerprint of the
    selected fields of its JSON body (``ValueError`` when it is no JSON).
    """

    __slots__ = ("_fields", "_source")

    def __init__(
        self,
        key: Callable[[Message], str | None] = message_id,
        *,
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_exclude: Iterable[str] | None = None,
    ) -> None:
        self._source = key
        self._fields = field_selection(fingerprint_include, fingerprint_exclude)

    def key(self, message: Message) -> str:
        found = self._source(message)
        if found is None:
            raise InvalidKeyError(f"message {message.id!r} carries no idempotency key")
        return found

    def fingerprint(self, message: Message) -> str:
        if self._fields is None:
            return hashlib.sha256(message.body).hexdigest()
        return fingerprint(self._fields.apply(message.json()))


UNKEYABLE = (InvalidKeyError, CanonicalizationError, ValueError)
"""What ``MessageKeying`` raises for a message it cannot key or fingerprint."""
