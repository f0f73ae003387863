"""Message consumers: each message's handler runs at most once per key, acked only after its
outcome is recorded (``idemstore.consumers.door``).

The door is broker-neutral; one module per broker adapts it: ``sqs`` (aiobotocore),
``redis_streams`` (redis-py), ``rabbitmq`` (aio-pika), ``nats`` (nats-py JetStream), and
``aws_lambda`` (Lambda handlers for SQS and HTTP events, on ``idemstore.sync``). Celery's
door is ``idemstore.consumers.celery``.
"""

from __future__ import annotations

from idemstore.consumers.door import ConsumerDoor, Delivery, Disposition, handle_all
from idemstore.consumers.messages import (
    KeySource,
    Message,
    MessageKeying,
    attribute,
    body_pointer,
    message_id,
)

__all__ = [
    "ConsumerDoor",
    "Delivery",
    "Disposition",
    "KeySource",
    "Message",
    "MessageKeying",
    "attribute",
    "body_pointer",
    "handle_all",
    "message_id",
]
