"""The Lambda handlers, invoked with the AWS event shapes and a context; DynamoDB (moto's
server) as the store."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from idemstore.consumers.aws_lambda import LambdaIdempotency, lease_for
from tests.conftest import ROOT
from tests.consumers.lambda_events import (
    Context,
    http_v1_event,
    http_v2_event,
    sqs_event,
    sqs_record,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from idemstore.consumers import Message

pytestmark = pytest.mark.slow


@pytest.fixture
def idem(dynamodb_store_url: str) -> Iterator[LambdaIdempotency]:
    with_lambda = LambdaIdempotency(dynamodb_store_url, lease_ttl=10)
    yield with_lambda
    with_lambda.close()


class Effects:
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def add(self, name: str) -> None:
        with self.lock:
            self.counts[name] += 1


def failed(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def test_the_lease_follows_the_time_left() -> None:
    assert lease_for(900, 30) == 30
    assert lease_for(5.5, 30) == 4
    assert lease_for(0.2, 30) == 1


def test_a_batch_with_a_failing_record_reports_only_that_one(idem: LambdaIdempotency) -> None:
    effects = Effects()

    @idem.sqs()
    def handler(message: Message, context: Any) -> dict[str, Any]:
        order = message.json()["order"]
        effects.add(order)
        if order == "bad" and effects.counts[order] == 1:
            raise RuntimeError("payment service down")
        return {"order": order}

    records = [sqs_record({"order": name}) for name in ("a", "bad", "c")]
    assert failed(handler(sqs_event(*records), Context())) == [records[1]["messageId"]]
    # SQS redelivers the whole batch's failures (and, at times, a done record too).
    assert failed(handler(sqs_event(*records), Context())) == []
    assert effects.counts == {"a": 1, "bad": 2, "c": 1}


def test_a_record_delivered_twice_runs_once_and_the_duplicate_sees_the_result(
    idem: LambdaIdempotency,
) -> None:
    effects, seen = Effects(), []

    @idem.sqs(on_duplicate=lambda message, value: seen.append(value))
    def handler(message: Message, context: Any) -> int:
        effects.add(message.id)
        return 42

    record = sqs_record({"order": "a"})
    assert failed(handler(sqs_event(record, record), Context())) == []
    assert effects.counts == {record["messageId"]: 1}
    assert seen == [42]


def test_concurrent_invocations_of_one_batch_run_each_record_once(
    idem: LambdaIdempotency,
) -> None:
    effects = Effects()

    @idem.sqs()
    def handler(message: Message, context: Any) -> str:
        effects.add(message.id)
        time.sleep(0.05)
        return "ok"

    event = sqs_event(*(sqs_record({"n": n}) for n in range(4)))
    pending = {r["messageId"] for r in event["Records"]}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        while pending:
            batch = sqs_event(*(r for r in event["Records"] if r["messageId"] in pending))
            answers = list(pool.map(handler, [batch] * 4, [Context() for _ in range(4)]))
            pending = set.intersection(*(set(failed(a)) for a in answers))
    assert effects.counts == {r["messageId"]: 1 for r in event["Records"]}


def test_an_invocation_out_of_time_runs_nothing_and_the_next_runs_once(
    idem: LambdaIdempotency,
) -> None:
    effects = Effects()

    @idem.sqs()
    def handler(message: Message, context: Any) -> str:
        effects.add(message.id)
        return "ok"

    records = [sqs_record({"n": n}) for n in range(3)]
    timed_out = handler(sqs_event(*records), Context(remaining_ms=0))
    assert failed(timed_out) == [r["messageId"] for r in records]
    assert effects.counts == {}
    assert failed(handler(sqs_event(*records), Context())) == []
    assert failed(handler(sqs_event(*records), Context())) == []
    assert effects.counts == {r["messageId"]: 1 for r in records}


VICTIM = """
import sys, time
from idemstore.consumers.aws_lambda import LambdaIdempotency
from tests.consumers.lambda_events import Context, sqs_event, sqs_record

idem = LambdaIdempotency(sys.argv[1], lease_ttl=30)

@idem.sqs()
def handler(message, context):
    print("started", flush=True)
    time.sleep(60)  # Lambda kills the invocation at its timeout, mid-handler

handler(sqs_event(sqs_record({"order": "a"}, message_id="m-killed")), Context(1500))
"""


def test_an_invocation_killed_at_its_timeout_is_taken_over_by_the_next(
    idem: LambdaIdempotency, dynamodb_store_url: str
) -> None:
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, dynamodb_store_url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "started"
    finally:
        victim.kill()
        victim.wait()
    takeovers: list[bool] = []

    @idem.sqs()
    def handler(message: Message, context: Any) -> str:
        from idemstore import current_execution

        execution = current_execution()
        takeovers.append(execution is not None and execution.takeover)
        return "ok"

    event = sqs_event(sqs_record({"order": "a"}, message_id="m-killed"))
    started = time.monotonic()
    while failed(handler(event, Context())):  # busy until the killed one's lease lapses
        assert time.monotonic() - started < 5, "the killed invocation's lease did not lapse"
        time.sleep(0.1)
    assert takeovers == [True]
    # Its lease was sized from its 1.5 s left (a 1 s lease), not the 30 s lease_ttl.
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("make_event", [http_v2_event, http_v1_event])
def test_an_http_retry_replays_the_response_without_running_again(
    idem: LambdaIdempotency, make_event: Any
) -> None:
    effects = Effects()

    @idem.http()
    def api(event: dict[str, Any], context: Any) -> dict[str, Any]:
        effects.add("charge")
        body = json.loads(event["body"])
        return {"statusCode": 201, "headers": {"x-order": body["order"]}, "body": "created"}

    event = make_event({"order": "o-1"}, key="k-1")
    first = api(event, Context())
    again = api(event, Context())
    assert first == {"statusCode": 201, "headers": {"x-order": "o-1"}, "body": "created"}
    assert again["headers"] == {"x-order": "o-1", "Idempotent-Replayed": "true"}
    assert again["statusCode"] == 201 and again["body"] == "created"
    assert effects.counts == {"charge": 1}


def test_http_refusals_are_the_http_doors_problem_documents(idem: LambdaIdempotency) -> None:
    gate, effects = threading.Event(), Effects()

    @idem.http(require_key=True)
    def api(event: dict[str, Any], context: Any) -> dict[str, Any]:
        effects.add("charge")
        gate.wait(5)
        return {"statusCode": 200, "body": "ok"}

    missing = api(http_v2_event({"order": 1}, key=None), Context())
    assert missing["statusCode"] == 400
    assert missing["headers"]["content-type"] == "application/problem+json"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(api, http_v2_event({"order": 1}, key="k"), Context())
        while not effects.counts:
            time.sleep(0.01)
        busy = api(http_v2_event({"order": 1}, key="k"), Context())
        gate.set()
        assert running.result()["statusCode"] == 200
    assert busy["statusCode"] == 409 and "retry-after" in busy["headers"]
    conflict = api(http_v2_event({"order": 2}, key="k"), Context())
    assert conflict["statusCode"] == 422
    assert json.loads(conflict["body"])["idempotencyKey"] == "k"
    late = api(http_v2_event({"order": 3}, key="k3"), Context(remaining_ms=0))
    assert late["statusCode"] == 503 and late["headers"]["retry-after"] == "1"
    assert effects.counts == {"charge": 1}
