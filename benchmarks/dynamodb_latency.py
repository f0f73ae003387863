"""Latency of DynamoDBStore against bare aiobotocore requests on the same endpoint, same run.

    PYTHONPATH=. python benchmarks/dynamodb_latency.py [--endpoint URL] [-n 2000]

Without ``--endpoint`` it starts moto's server on a loopback port (idemstore.local_servers)
and uses dummy credentials; with one, it uses the AWS credential chain and creates (then
drops) a throwaway table. Operations run one at a time, so the numbers are latencies, not
throughput. Rows:

- ``bare PutItem (conditional)``: one ``PutItem`` with ``attribute_not_exists``: the floor
  for any conditional write on this endpoint and client.
- ``bare PutItem + UpdateItem``: the two-request floor that ``reserve`` + ``complete`` match.
- ``bare, reserve's + complete's requests``: the very requests ``reserve`` and ``complete``
  send, built by hand on the bare client: the endpoint's cost of idemstore's expressions.
- ``reserve + complete``: ``DynamoDBStore.reserve`` then ``complete`` on a fresh key.
- ``reserve (replay)``: ``reserve`` on a completed key (the failed condition returns it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

from idemstore.backends import dynamodb as ddb
from idemstore.backends.dynamodb import DynamoDBStore, _partition_key

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def summary(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return (
        f"| {name} | {len(ms)} | {statistics.fmean(ms):.2f} | {p(0.5):.2f} | {p(0.95):.2f} "
        f"| {p(0.99):.2f} |"
    )


async def timed(n: int, one: Callable[[int], Awaitable[Any]]) -> list[float]:
    samples = []
    for i in range(n):
        started = time.perf_counter()
        await one(i)
        samples.append(time.perf_counter() - started)
    return samples


async def run(endpoint: str, region: str, n: int, warmup: int) -> None:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    table = f"idem_bench_{uuid.uuid4().hex[:12]}"
    url = f"dynamodb://{table}?region={region}&endpoint_url={endpoint}"
    store = DynamoDBStore.from_url(url)
    # The bare client gets the configuration the store gives its own client.
    config = AioConfig(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=2.0,
        read_timeout=5.0,
        max_pool_connections=50,
    )
    session = AioSession()
    async with session.create_client(
        "dynamodb", region_name=region, endpoint_url=endpoint, config=config
    ) as client:
        await store.create_table()
        try:
            run_id = uuid.uuid4().hex[:8]

            async def bare_put(i: int) -> None:
                await client.put_item(
                    TableName=table,
                    Item={
                        "pk": {"S": f"bare-{run_id}-{i}"},
                        "status": {"S": "in_progress"},
                        "token": {"S": uuid.uuid4().hex},
                        "fence": {"N": "1"},
                    },
                    ConditionExpression="attribute_not_exists(pk)",
                )

            async def bare_put_update(i: int) -> None:
                token = uuid.uuid4().hex
                pk = {"S": f"pair-{run_id}-{i}"}
                await client.put_item(
                    TableName=table,
                    Item={"pk": pk, "status": {"S": "in_progress"}, "token": {"S": token}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
                await client.update_item(
                    TableName=table,
                    Key={"pk": pk},
                    UpdateExpression="SET #s = :c, #r = :r",
                    ConditionExpression="#t = :t AND #s = :p",
                    ExpressionAttributeNames={"#s": "status", "#r": "response", "#t": "token"},
                    ExpressionAttributeValues={
                        ":c": {"S": "completed"},
                        ":r": {"B": b'{"ok": true}'},
                        ":t": {"S": token},
                        ":p": {"S": "in_progress"},
                    },
                )

            async def bare_same_requests(i: int) -> None:
                # Exactly the two requests reserve + complete send, built by hand: what is
                # left between this row and "reserve + complete" is idemstore's own cost.
                now = time.time()
                pk = _partition_key("", f"same-{run_id}-{i}")
                token = uuid.uuid4().hex
                await client.update_item(
                    TableName=table,
                    Key=pk,
                    UpdateExpression=ddb.RESERVE_UPDATE,
                    ConditionExpression=ddb.RESERVE_CONDITION,
                    ExpressionAttributeNames=ddb._names(*ddb.RESERVE_NAMES),
                    ExpressionAttributeValues={
                        ":scope": {"S": ""},
                        ":key": {"S": f"same-{run_id}-{i}"},
                        ":fp": {"S": "fp"},
                        ":in_progress": {"S": "in_progress"},
                        ":released": {"S": "released"},
                        ":token": {"S": token},
                        ":now": {"N": repr(now)},
                        ":exp": {"N": repr(now + 3600)},
                        ":lease": {"N": repr(now + 30)},
                        ":ttl": {"N": str(int(now) + 3601)},
                        ":horizon": {"N": repr(now - 0.1)},
                        ":zero": {"N": "0"},
                        ":one": {"N": "1"},
                    },
                    ReturnValues="ALL_OLD",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                await client.update_item(
                    TableName=table,
                    Key=pk,
                    UpdateExpression=ddb.COMPLETE_UPDATE,
                    ConditionExpression=ddb.HOLDER_CONDITION,
                    ExpressionAttributeNames=ddb._names(
                        *ddb.HOLDER_NAMES, "#response", "#compressed", "#ttl", "#lease"
                    ),
                    ExpressionAttributeValues={
                        ":token": {"S": token},
                        ":fence": {"N": "1"},
                        ":in_progress": {"S": "in_progress"},
                        ":horizon": {"N": repr(now - 0.1)},
                        ":op": {"S": uuid.uuid4().hex},
                        ":completed": {"S": "completed"},
                        ":response": {"B": b'{"ok": true}'},
                        ":compressed": {"BOOL": False},
                        ":exp": {"N": repr(now + 3600)},
                        ":ttl": {"N": str(int(now) + 3601)},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )

            async def reserve_complete(i: int) -> None:
                r = await store.reserve(f"rc-{run_id}-{i}", "fp", lease_ttl=30, retention=3600)
                assert r.lease is not None
                assert await store.complete(r.lease, b'{"ok": true}')

            async def replay(i: int) -> None:
                r = await store.reserve(f"rc-{run_id}-{i}", "fp", lease_ttl=30, retention=3600)
                assert r.record is not None and r.record.response == b'{"ok": true}'

            cases = [
                ("bare PutItem (conditional)", bare_put),
                ("bare PutItem + UpdateItem", bare_put_update),
                ("bare, reserve's + complete's requests", bare_same_requests),
                ("reserve + complete", reserve_complete),
                ("reserve (replay)", replay),
            ]
            # Warm up connections and code paths on keys the measured runs never use.
            for _, one in cases[:4]:
                await timed(warmup, lambda i, one=one: one(-1 - i))  # type: ignore[misc]
            results = {}
            # Interleave rounds so drift on a shared machine hits every row alike.
            rounds = 4
            per_round = n // rounds
            for r in range(rounds):
                for name, one in cases:
                    base = r * per_round
                    samples = await timed(per_round, lambda i, one=one, base=base: one(base + i))  # type: ignore[misc]
                    results.setdefault(name, []).extend(samples)
            print(f"endpoint {endpoint}, {n} operations per row, sequential\n")
            print("| operation | n | mean ms | p50 ms | p95 ms | p99 ms |")
            print("|---|---|---|---|---|---|")
            for name, _ in cases:
                print(summary(name, results[name]))
            rc50 = statistics.median(results["reserve + complete"])
            for floor in ("bare PutItem + UpdateItem", "bare, reserve's + complete's requests"):
                ratio = rc50 / statistics.median(results[floor])
                print(f"\nreserve + complete p50 / {floor} p50 = {ratio:.2f}")
        finally:
            await store.close()
            await client.delete_table(TableName=table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", help="DynamoDB endpoint URL (default: start moto)")
    parser.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    parser.add_argument("-n", type=int, default=2000, help="operations per row")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    server = None
    if args.endpoint is None:
        from idemstore.local_servers.dynamodb import start_dynamodb

        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        server = start_dynamodb()
        args.endpoint = server.url
    try:
        asyncio.run(run(args.endpoint, args.region, args.n, args.warmup))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
