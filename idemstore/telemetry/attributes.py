"""The attribute names idemstore's metrics and spans carry, and how a store's engine is named.

Apart so that every part of ``idemstore.telemetry`` reads them from one place without the
parts importing each other; nothing here needs ``opentelemetry``.
"""

from __future__ import annotations

__all__ = [
    "BACKEND",
    "CALL_OUTCOME",
    "CONSUMER",
    "ERROR_TYPE",
    "FENCE",
    "HEARTBEAT_FAILURE",
    "KEY",
    "KEY_HASH",
    "OPERATION",
    "OUTCOME",
    "RESERVE_OUTCOME",
    "SCOPE",
    "SWEEP_REMOVED",
    "TAKEOVER",
    "WAIT_OUTCOME",
    "backend_name",
]

BACKEND = "idemstore.backend"
OPERATION = "idemstore.operation"
OUTCOME = "idemstore.outcome"
FENCE = "idemstore.fence"
TAKEOVER = "idemstore.reserve.takeover"
RESERVE_OUTCOME = "idemstore.reserve.outcome"
WAIT_OUTCOME = "idemstore.wait.outcome"
HEARTBEAT_FAILURE = "idemstore.heartbeat.failure"
CONSUMER = "idemstore.consumer"
CALL_OUTCOME = "idemstore.call.outcome"
SWEEP_REMOVED = "idemstore.sweep.removed"
KEY = "idemstore.key"
SCOPE = "idemstore.scope"
KEY_HASH = "idemstore.key.hash"
ERROR_TYPE = "error.type"


def backend_name(store: object) -> str:
    """The engine a store runs on, as the store declares it (a ``backend`` attribute), else
    its class name without the ``Store`` suffix (``RedisStore`` -> ``redis``)."""
    declared = getattr(store, "backend", None)
    if isinstance(declared, str) and declared:
        return declared
    return type(store).__name__.removesuffix("Store").lower() or "unknown"
