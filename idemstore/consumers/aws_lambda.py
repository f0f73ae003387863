"""AWS Lambda: handlers that run once per key, for SQS events and HTTP events.

Lambda functions are synchronous; these run on ``idemstore.sync``::

    idem = LambdaIdempotency("dynamodb://idempotency?region=eu-west-1")

    @idem.sqs()
    def handler(message: Message, context) -> dict: ...        # -> {"batchItemFailures": [...]}

    @idem.http()
    def api(event: dict, context) -> dict: ...                 # API Gateway / function URL

**The lease follows the invocation.** Each invocation's lease is sized from
``context.get_remaining_time_in_millis()`` (at most ``lease_ttl``) and heartbeated while the
handler runs. When Lambda kills an invocation at its timeout the heartbeat stops with it, the
lease lapses within that size, and the next invocation takes the key over exactly as it would
from a killed worker (``on_takeover``). An invocation with less than ``min_remaining`` seconds
left starts nothing: its SQS records are reported as failures (redelivered), an HTTP request
gets a 503 problem with ``Retry-After``.

**SQS** (partial batch response: enable ``ReportBatchItemFailures`` on the event source
mapping): every record is keyed and fingerprinted as by the async door (``MessageKeying``:
message id by default). A record whose handler raised, whose key another invocation holds,
or that cannot succeed (conflict, outcome unknown: the redrive policy's dead-letter queue
takes it after ``maxReceiveCount``) is listed in ``batchItemFailures``, and so is one whose
lease was lost while it ran (the message is deleted only by the key's holder); a duplicate
replays (``on_duplicate``) and counts as done.

**HTTP** (API Gateway REST and HTTP APIs, function URLs): the ``Idempotency-Key`` header
keys the request; the fingerprint covers method, path, query and body. A retry gets the
recorded response plus ``Idempotent-Replayed: true``; refusals are the HTTP door's problem
documents (``idemstore.problems``): 409 in progress, 422 conflict, 400 invalid key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import threading
from typing import TYPE_CHECKING, Any, Literal

from idemstore import current_execution, fingerprint, sync
from idemstore.consumers.messages import UNKEYABLE, Message, MessageKeying, message_id
from idemstore.consumers.sqs import sqs_message
from idemstore.execution.refusals import Refusal, refusal_of
from idemstore.fingerprint_fields import field_selection
from idemstore.problems import problem, refusal_problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from idemstore import IdempotencyStore, Serializer

__all__ = ["LambdaIdempotency", "lease_for"]

logger = logging.getLogger("idemstore.consumers")

REPLAYED_HEADER = "Idempotent-Replayed"

# Retry-After, in seconds, for an invocation that had too little time to start the work.
_RETRY_AFTER = 1


def lease_for(remaining: float, lease_ttl: float) -> float:
    """The lease an invocation with ``remaining`` seconds left holds: at most ``lease_ttl``,
    at most the remaining time, rounded down to a power of two seconds (at least one), so a
    container needs few runners however its invocations' remaining times vary."""
    bounded = max(1.0, min(lease_ttl, remaining))
    return float(2 ** math.floor(math.log2(bounded))) if bounded < lease_ttl else lease_ttl


class LambdaIdempotency:
    """Decorators for Lambda handlers, over one store.

    Args:
        store: a store URL, or a zero-argument callable returning an ``IdempotencyStore``
            (as ``idemstore.sync.Idempotency`` takes it).
        store_options: engine options for a URL.
        lease_ttl: the longest lease an invocation holds (default 30 s); shorter when the
            invocation has less time left (``lease_for``).
        min_remaining: seconds an invocation must have left to start a handler (default 1).
        retention: as ``idemstore.Idempotency``.
        on_failure: as ``idemstore.Idempotency``.
        on_takeover: as ``idemstore.Idempotency``.
        max_response_bytes: as ``idemstore.Idempotency``.
        serializer: as ``idemstore.Idempotency``. A duplicate in flight never waits: it is
            refused.

    Build it at module level (outside the handler), so a warm container reuses its
    connections. ``close()`` ends its loop threads.
    """

    __slots__ = ("_lock", "_options", "_runners", "_store", "lease_ttl", "min_remaining")

    def __init__(
        self,
        store: str | Callable[[], IdempotencyStore],
        *,
        store_options: Mapping[str, Any] | None = None,
        lease_ttl: float = 30.0,
        min_remaining: float = 1.0,
        retention: float = 86400.0,
        on_failure: Literal["release", "hold"] = "release",
        on_takeover: Literal["run", "refuse"] = "run",
        max_response_bytes: int | None = None,
        serializer: Serializer | None = None,
    ) -> None:
        self._store = store
        self._options: dict[str, Any] = {
            "store_options": store_options,
            "retention": retention,
            "on_failure": on_failure,
            "on_takeover": on_takeover,
            "max_response_bytes": max_response_bytes,
            "serializer": serializer,
            "in_flight": "reject",
        }
        self.lease_ttl = lease_ttl
        self.min_remaining = min_remaining
        self._runners: dict[float, sync.Idempotency] = {}
        self._lock = threading.Lock()
        self.runner(lease_ttl)  # opens the store and checks every option now

    def runner(self, lease: float) -> sync.Idempotency:
        """The synchronous runner whose lease is ``lease`` seconds (one per lease size)."""
        with self._lock:
            found = self._runners.get(lease)
            if found is None:
                found = self._runners[lease] = sync.Idempotency(
                    self._store, lease_ttl=lease, **self._options
                )
            return found

    def close(self) -> None:
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close()

    def _remaining(self, context: Any) -> float:
        return max(0.0, float(context.get_remaining_time_in_millis()) / 1000.0)

    def sqs(
        self,
        *,
        key: Callable[[Message], str | None] = message_id,
        scope: str = "lambda-sqs",
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_exclude: Iterable[str] | None = None,
        on_duplicate: Callable[[Message, Any], None] | None = None,
    ) -> Callable[[Callable[[Message, Any], Any]], Callable[[dict[str, Any], Any], dict[str, Any]]]:
        """Decorate ``handler(message, context)``, run once per record's key; the result is
        the partial batch response ``{"batchItemFailures": [{"itemIdentifier": id}, ...]}``.

        ``key``, ``fingerprint_include``/``fingerprint_exclude`` and ``on_duplicate`` are
        the async door's (``ConsumerDoor``); what the handler returns is recorded.
        """
        keying = MessageKeying(
            key, fingerprint_include=fingerprint_include, fingerprint_exclude=fingerprint_exclude
        )

        def decorate(
            handler: Callable[[Message, Any], Any],
        ) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
            def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
                failures: list[dict[str, str]] = []
                for record in event.get("Records", ()):
                    message = sqs_message(record)
                    if not self._record_done(
                        message, context, handler, keying, scope, on_duplicate
                    ):
                        failures.append({"itemIdentifier": message.id})
                return {"batchItemFailures": failures}

            lambda_handler.__wrapped__ = handler  # type: ignore[attr-defined]
            lambda_handler.__name__ = getattr(handler, "__name__", "lambda_handler")
            return lambda_handler

        return decorate

    def _record_done(
        self,
        message: Message,
        context: Any,
        handler: Callable[[Message, Any], Any],
        keying: MessageKeying,
        scope: str,
        on_duplicate: Callable[[Message, Any], None] | None,
    ) -> bool:
        """Whether the record is done (delete it) rather than failed (redeliver it)."""
        remaining = self._remaining(context)
        if remaining < self.min_remaining:
            logger.warning("message %r left for later: %.3f s left", message.id, remaining)
            return False
        try:
            key = keying.key(message)
            print_ = keying.fingerprint(message)
        except UNKEYABLE as exc:
            logger.warning("message %r cannot be keyed: %s", message.id, exc)
            return False
        runner = self.runner(lease_for(remaining, self.lease_ttl))
        lost: list[bool] = []

        def work() -> bytes:
            data = runner.serializer.dumps(handler(message, context))
            lost.append(_lease_lapsed())
            return data

        try:
            result = runner.run(key, print_, work, scope=scope)
        except Exception as exc:
            refusal = refusal_of(exc)
            if refusal is Refusal.OUTCOME_UNRECORDED:
                logger.warning("message %r done; its handler ran: %s", message.id, exc)
                return True
            logger.warning("message %r failed: %s", message.id, exc, exc_info=refusal is None)
            return False
        if result.replayed:
            if on_duplicate is not None:
                on_duplicate(message, runner.serializer.loads(result.value, Any))
            return True
        if lost and lost[0]:
            logger.warning("message %r: lease lost while the handler ran; not deleted", message.id)
            return False
        return True

    def http(
        self,
        *,
        scope: str = "lambda-http",
        header: str = "Idempotency-Key",
        require_key: bool = False,
        fingerprint_include: Iterable[str] | None = None,
        fingerprint_exclude: Iterable[str] | None = None,
    ) -> Callable[[Callable[[dict[str, Any], Any], Any]], Callable[[dict[str, Any], Any], Any]]:
        """Decorate ``handler(event, context)`` of an API Gateway or function URL event
        (payload 1.0 or 2.0) that returns a response (``{"statusCode": ..., "headers":
        ..., "body": ...}``); a request with an ``Idempotency-Key`` runs it once per key.

        ``fingerprint_include``/``fingerprint_exclude``: JSON pointers into a JSON body
        that the fingerprint is limited to, or leaves out. A request without the header
        runs without deduplication, or gets a 400 problem when ``require_key``.
        """
        fields = field_selection(fingerprint_include, fingerprint_exclude)
        wanted = header.lower()

        def decorate(
            handler: Callable[[dict[str, Any], Any], Any],
        ) -> Callable[[dict[str, Any], Any], Any]:
            def lambda_handler(event: dict[str, Any], context: Any) -> Any:
                headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
                key = headers.get(wanted)
                if key is None:
                    if require_key:
                        return _response(
                            problem(
                                400,
                                "Idempotency-Key missing",
                                f"This endpoint requires an {header} header.",
                            )
                        )
                    return handler(event, context)
                remaining = self._remaining(context)
                if remaining < self.min_remaining:
                    return _response(
                        problem(
                            503,
                            "Too little time left",
                            "The request was not processed: its invocation had too little"
                            " time left to run it; retry later with the same key.",
                            key=key,
                            retry_after=_RETRY_AFTER,
                        )
                    )
                try:
                    print_ = _http_fingerprint(event, fields)
                except ValueError as exc:
                    return _response(refusal_problem(Refusal.CONFLICT, key=key, detail=str(exc)))
                runner = self.runner(lease_for(remaining, self.lease_ttl))

                def work() -> bytes:
                    return runner.serializer.dumps(handler(event, context))

                try:
                    result = runner.run(key, print_, work, scope=scope)
                except Exception as exc:
                    refusal = refusal_of(exc)
                    if refusal is None:
                        raise  # the handler's own error: Lambda reports it
                    return _response(refusal_problem(refusal, key=key))
                response = runner.serializer.loads(result.value, Any)
                if result.replayed and isinstance(response, dict):
                    response = {
                        **response,
                        "headers": {**(response.get("headers") or {}), REPLAYED_HEADER: "true"},
                    }
                return response

            lambda_handler.__wrapped__ = handler  # type: ignore[attr-defined]
            lambda_handler.__name__ = getattr(handler, "__name__", "lambda_handler")
            return lambda_handler

        return decorate


def _lease_lapsed() -> bool:
    execution = current_execution()
    return execution is not None and execution.lapsed


def _http_fingerprint(event: dict[str, Any], fields: Any) -> str:
    context = event.get("requestContext") or {}
    method = event.get("httpMethod") or (context.get("http") or {}).get("method", "")
    path = event.get("rawPath") or event.get("path") or ""
    query = event.get("rawQueryString")
    if query is None:
        query = sorted((event.get("queryStringParameters") or {}).items())
    body = event.get("body") or ""
    raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode("utf-8")
    covered: Any = (
        hashlib.sha256(raw).hexdigest() if fields is None else fields.apply(json.loads(raw))
    )
    return fingerprint({"method": method, "path": path, "query": query, "body": covered})


def _response(answer: tuple[int, list[tuple[bytes, bytes]], bytes]) -> dict[str, Any]:
    status, headers, body = answer
    return {
        "statusCode": status,
        "headers": {name.decode("latin-1"): value.decode("latin-1") for name, value in headers},
        "body": body.decode("utf-8"),
    }
