# ruff: noqa: E501, SIM115 (a measurement script, kept as it ran)
"""DynamoDB request shapes on one endpoint: p50 per request and the endpoint process's CPU per
request (from /proc, so the endpoint must run on this machine), sync boto3 and the store's
aiobotocore, interleaved rounds. Usage (docs/benchmarks.md, issue #46):

    python -m idemstore.local_servers.dynamodb --port 26400 & echo $! > /tmp/moto.pid
    idemstore migrate "dynamodb://bench_records?endpoint_url=http://127.0.0.1:26400&region=us-east-1"
    MOTO_PID_FILE=/tmp/moto.pid python scripts/issue-46/dynamodb_request_shapes.py
"""

import asyncio
import os
import secrets
import time

import boto3

from idemstore.backends.dynamodb import items as I
from idemstore.backends.urls import open_store

EP = "http://127.0.0.1:26400"
TABLE = "bench_records"
MOTO = int(open(os.environ.get("MOTO_PID_FILE", "/tmp/moto.pid")).read())
N = int(os.environ.get("N", "150"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def moto_cpu():
    f = open(f"/proc/{MOTO}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


c = boto3.client("dynamodb", endpoint_url=EP, region_name="us-east-1")
run = secrets.token_hex(3)


def floor(k):
    c.put_item(
        TableName=TABLE,
        Item={"pk": {"S": k}, "v": {"S": "x"}},
        ConditionExpression="attribute_not_exists(pk)",
    )


def powertools_put(k):
    now = time.time()
    c.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": k},
            "expiration": {"N": str(int(now) + 3600)},
            "status": {"S": "INPROGRESS"},
        },
        ConditionExpression="attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress AND attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis)",
        ExpressionAttributeNames={
            "#id": "pk",
            "#expiry": "expiration",
            "#in_progress_expiry": "in_progress_expiration",
            "#status": "status",
        },
        ExpressionAttributeValues={
            ":now": {"N": str(int(now))},
            ":now_in_millis": {"N": str(int(now * 1000))},
            ":inprogress": {"S": "INPROGRESS"},
        },
    )


def reserve_values(k, now):
    return {
        ":scope": {"S": "s"},
        ":key": {"S": k},
        ":fp": {"S": "f" * 64},
        ":in_progress": {"S": "in_progress"},
        ":released": {"S": "released"},
        ":token": {"S": secrets.token_hex(16)},
        ":now": {"N": repr(now)},
        ":exp": {"N": repr(now + 3600)},
        ":lease": {"N": repr(now + 30)},
        ":ttl": {"N": str(int(now) + 3601)},
        ":horizon": {"N": repr(now)},
        ":zero": {"N": "0"},
        ":one": {"N": "1"},
    }


def store_shape(k, rv=True):
    kw = dict(ReturnValues="ALL_OLD", ReturnValuesOnConditionCheckFailure="ALL_OLD") if rv else {}
    c.update_item(
        TableName=TABLE,
        Key={"pk": {"S": k}},
        UpdateExpression=I.RESERVE_UPDATE,
        ConditionExpression=I.RESERVE_CONDITION,
        ExpressionAttributeNames=I.names(*I.RESERVE_NAMES),
        ExpressionAttributeValues=reserve_values(k, time.time()),
        **kw,
    )


def store_shape_norv(k):
    store_shape(k, False)


def put_shape(k):
    now = time.time()
    c.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": k},
            "scope": {"S": "s"},
            "key": {"S": k},
            "fingerprint": {"S": "f" * 64},
            "status": {"S": "in_progress"},
            "token": {"S": secrets.token_hex(16)},
            "fence": {"N": "1"},
            "created_at": {"N": repr(now)},
            "expires_at": {"N": repr(now + 3600)},
            "lease_expires_at": {"N": repr(now + 30)},
            "ttl": {"N": str(int(now) + 3601)},
        },
        ConditionExpression="attribute_not_exists(pk)",
    )


SYNC = {
    "floor PutItem": floor,
    "powertools PutItem": powertools_put,
    "reserve UpdateItem (boto3)": store_shape,
    "reserve UpdateItem no ReturnValues": store_shape_norv,
    "PutItem of the same item": put_shape,
}


async def main():
    store = open_store(f"dynamodb://{TABLE}?endpoint_url={EP}&region=us-east-1")
    await store.__aenter__()

    async def store_reserve(k):
        await store.reserve(k, "f" * 64, scope="s", lease_ttl=30, retention=3600)

    asyncio.get_running_loop()
    res = {}
    names = [*list(SYNC), "DynamoDBStore.reserve (aiobotocore)"]
    for rnd in range(ROUNDS):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            lat = []
            m0 = moto_cpu()
            time.perf_counter()
            for i in range(N):
                k = f"{run}-{names.index(name)}-{rnd}-{i}"
                b = time.perf_counter()
                if name in SYNC:
                    SYNC[name](k)
                else:
                    await store_reserve(k)
                lat.append(time.perf_counter() - b)
            lat.sort()
            res.setdefault(name, []).append((lat[N // 2] * 1e3, (moto_cpu() - m0) / N * 1e3))
    for name, v in res.items():
        p = sorted(x[0] for x in v)[len(v) // 2]
        m = sorted(x[1] for x in v)[len(v) // 2]
        print(f"{name:40s} p50 {p:6.2f} ms   moto CPU {m:5.2f} ms/request")
    await store.close()


os.environ.setdefault("AWS_ACCESS_KEY_ID", "x")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "x")
asyncio.run(main())
