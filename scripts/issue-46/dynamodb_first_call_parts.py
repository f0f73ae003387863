# ruff: noqa: E501, SIM115 (a measurement script, kept as it ran)
"""Where a DynamoDB first call's time goes: p50 per request and the endpoint process's CPU per
request (from /proc, so the endpoint must run on this machine), for the store's reserve and
complete (through the store), the completion's request shapes (through boto3, beside
Powertools' completion), and a whole first call through the async and the sync door.
Interleaved rounds. Usage (docs/benchmarks.md, issue #46):

    python -m idemstore.local_servers.dynamodb --port 26400 & echo $! > /tmp/moto.pid
    idemstore migrate "dynamodb://bench_records?endpoint_url=http://127.0.0.1:26400&region=us-east-1"
    MOTO_PID_FILE=/tmp/moto.pid python scripts/issue-46/dynamodb_first_call_parts.py
"""

import asyncio
import os
import secrets
import time

import boto3

from idemstore import sync
from idemstore.backends.dynamodb import items as I
from idemstore.backends.urls import open_store
from idemstore.runner import Idempotency

EP = os.environ.get("ENDPOINT", "http://127.0.0.1:26400")
TABLE = "bench_records"
URL = f"dynamodb://{TABLE}?endpoint_url={EP}&region=us-east-1"
MOTO = int(open(os.environ.get("MOTO_PID_FILE", "/tmp/moto.pid")).read())
N = int(os.environ.get("N", "150"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
RESPONSE = b'{"charged": 42, "currency": "EUR"}'


def moto_cpu():
    f = open(f"/proc/{MOTO}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


c = boto3.client("dynamodb", endpoint_url=EP, region_name="us-east-1")
run = secrets.token_hex(3)


def held_item(k, token):
    now = time.time()
    return {
        "pk": {"S": k},
        "scope": {"S": "s"},
        "key": {"S": k},
        "fingerprint": {"S": "f" * 64},
        "status": {"S": "in_progress"},
        "token": {"S": token},
        "fence": {"N": "1"},
        "created_at": {"N": repr(now)},
        "expires_at": {"N": repr(now + 3600)},
        "lease_expires_at": {"N": repr(now + 30)},
        "ttl": {"N": str(int(now) + 3601)},
    }


def prepare(k):
    """An in-progress item as the first claim left it (untimed)."""
    token = secrets.token_hex(16)
    c.put_item(TableName=TABLE, Item=held_item(k, token))
    return token


def update_complete(k, token, room=True):
    now = time.time()
    extra = {":most": {"N": "100"}} if room else {}
    c.update_item(
        TableName=TABLE,
        Key={"pk": {"S": k}},
        UpdateExpression=I.COMPLETE_UPDATE,
        ConditionExpression=I.HOLDER_CONDITION + (I.ROOM_CONDITION if room else ""),
        ExpressionAttributeNames=I.names(
            *I.HOLDER_NAMES,
            "#response",
            "#compressed",
            "#ttl",
            "#lease",
            *(("#cp",) if room else ()),
        ),
        ExpressionAttributeValues={
            ":token": {"S": token},
            ":fence": {"N": "1"},
            ":in_progress": {"S": "in_progress"},
            ":horizon": {"N": repr(now - 0.1)},
            ":op": {"S": secrets.token_hex(16)},
            ":completed": {"S": "completed"},
            ":response": {"B": RESPONSE},
            ":compressed": {"BOOL": False},
            ":exp": {"N": repr(now + 3600)},
            ":ttl": {"N": str(int(now) + 3601)},
            **extra,
        },
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )


def put_complete(k, token, condition):
    now = time.time()
    item = held_item(k, token)
    del item["lease_expires_at"]
    item.update(
        status={"S": "completed"},
        response={"B": RESPONSE},
        compressed={"BOOL": False},
        op={"S": secrets.token_hex(16)},
    )
    used = {p for p in ("#token", "#fence", "#status", "#exp", "#cp") if p in condition}
    values = {
        ":token": {"S": token},
        ":fence": {"N": "1"},
        ":in_progress": {"S": "in_progress"},
        ":horizon": {"N": repr(now - 0.1)},
    }
    c.put_item(
        TableName=TABLE,
        Item=item,
        ConditionExpression=condition,
        ExpressionAttributeNames=I.names(*sorted(used)),
        ExpressionAttributeValues={k: v for k, v in values.items() if k in condition},
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )


def powertools_complete(k, token):
    now = time.time()
    c.update_item(
        TableName=TABLE,
        Key={"pk": {"S": k}},
        UpdateExpression="SET #response_data = :response_data, #expiry = :expiry, #status = :status",
        ExpressionAttributeNames={
            "#response_data": "data",
            "#expiry": "expiration",
            "#status": "status",
        },
        ExpressionAttributeValues={
            ":expiry": {"N": str(int(now) + 3600)},
            ":response_data": {"S": RESPONSE.decode()},
            ":status": {"S": "COMPLETED"},
        },
    )


FULL = "#token = :token AND #fence = :fence AND #status = :in_progress AND #exp > :horizon AND attribute_not_exists(#cp)"
SHORT = (
    "#token = :token AND #status = :in_progress AND #exp > :horizon AND attribute_not_exists(#cp)"
)
SHAPES = {
    "complete UpdateItem (HOLDER + ROOM)": update_complete,
    "complete UpdateItem, no ROOM": lambda k, t: update_complete(k, t, room=False),
    "complete PutItem, token+fence+status+exp+no cp": lambda k, t: put_complete(k, t, FULL),
    "complete PutItem, token+status+exp+no cp": lambda k, t: put_complete(k, t, SHORT),
    "Powertools' completion UpdateItem": powertools_complete,
}


async def main():
    store = open_store(URL)
    await store.__aenter__()
    runner = Idempotency(store, lease_ttl=30, retention=3600)
    door = await asyncio.to_thread(sync.Idempotency, URL, lease_ttl=30, retention=3600)

    async def work():
        return RESPONSE

    async def async_first(k):
        await runner.run(k, "f" * 64, work, scope="s")

    def sync_first(k):
        door.run(k, "f" * 64, lambda: RESPONSE, scope="s")

    res = {}

    def note(name, lat, cpu):
        lat.sort()
        res.setdefault(name, []).append((lat[len(lat) // 2] * 1e3, cpu / len(lat) * 1e3))

    names = [*SHAPES, "store: reserve + complete", "async door first call", "sync door first call"]
    for rnd in range(ROUNDS):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            keys = [f"{run}-{names.index(name)}-{rnd}-{i}" for i in range(N)]
            if name in SHAPES:
                tokens = [prepare(k) for k in keys]
                lat = []
                m0 = moto_cpu()
                for k, t in zip(keys, tokens, strict=True):
                    b = time.perf_counter()
                    SHAPES[name](k, t)
                    lat.append(time.perf_counter() - b)
                note(name, lat, moto_cpu() - m0)
            elif name == "store: reserve + complete":
                rl, cl, rc, cc = [], [], 0.0, 0.0
                for k in keys:
                    m0 = moto_cpu()
                    b = time.perf_counter()
                    got = await store.reserve(k, "f" * 64, scope="s", lease_ttl=30, retention=3600)
                    m = time.perf_counter()
                    m1 = moto_cpu()
                    assert await store.complete(got.lease, RESPONSE)
                    cl.append(time.perf_counter() - m)
                    rl.append(m - b)
                    rc += m1 - m0
                    cc += moto_cpu() - m1
                note("store.reserve (first claim)", rl, rc)
                note("store.complete", cl, cc)
            else:
                lat = []
                m0 = moto_cpu()
                for k in keys:
                    b = time.perf_counter()
                    if name.startswith("sync"):
                        await asyncio.to_thread(sync_first, k)
                    else:
                        await async_first(k)
                    lat.append(time.perf_counter() - b)
                note(name, lat, moto_cpu() - m0)
    for name, v in res.items():
        p = sorted(x[0] for x in v)[len(v) // 2]
        m = sorted(x[1] for x in v)[len(v) // 2]
        print(f"{name:48s} p50 {p:6.2f} ms   moto CPU {m:5.2f} ms/request")
    await asyncio.to_thread(door.close)
    await store.close()


os.environ.setdefault("AWS_ACCESS_KEY_ID", "x")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "x")
asyncio.run(main())
