"""Message consumers under crashes: every event's effect exactly once, nothing lost or stuck.

    python -m tests.reliability.consumer_crashes --broker sqs --events 200 --kills 20 --pauses 10

A producer sends every event twice (two messages, one business key: ``body_pointer("/event")``)
while ``--workers`` consumer processes (``idemstore.consumers`` on the broker, an SQLite store)
handle them, and this process SIGKILLs workers mid-handler (and starts new ones) and SIGSTOPs
others past their lease and the broker's deadline (then SIGCONTs them). Each handler records
an attempt in its own transaction, works for a while, then applies the event's effect and
settles the key in one transaction (``settle(connection=...)``): an effect row per event whose
counter rises on every commit. The history check: every event's counter is exactly 1 (never
twice, never missing) and the broker ends with nothing ready, in flight or pending.

One broker per run, started on loopback from the binaries on PATH (moto's server for SQS).
``scripts/consumer-crashes`` runs every broker at a larger size; the test
(tests/reliability/test_consumer_crashes.py) a small one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BROKERS", "campaign"]

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("sqs", "redis", "rabbitmq", "nats")
NAME = "orders"
TABLES = """
CREATE TABLE IF NOT EXISTS attempts (event TEXT NOT NULL, pid INTEGER NOT NULL);
-- One row per event: the unique key makes a second effect visible as n = 2, never a new row.
CREATE TABLE IF NOT EXISTS effects (event TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""


# ---------------------------------------------------------------------------- the worker


async def _worker(broker: str, address: str, db: str, lease: float) -> None:
    import aiosqlite

    from idemstore import Idempotency, current_execution, open_store
    from idemstore.consumers import ConsumerDoor, Message, body_pointer

    store = open_store(f"sqlite:///{db}")
    door = ConsumerDoor(
        Idempotency(store, lease_ttl=lease),
        key=body_pointer("/event"),
        scope="crashes",
        busy_delay=lease / 2,
        failure_delay=lease / 4,
    )
    connection = await aiosqlite.connect(db, isolation_level=None, timeout=60)
    transaction = asyncio.Lock()  # one connection: one transaction at a time

    async def handler(message: Message) -> None:
        event = message.json()["event"]
        async with transaction:
            await connection.execute(
                "INSERT INTO attempts (event, pid) VALUES (?, ?)", (event, os.getpid())
            )
        await asyncio.sleep(random.uniform(0.02, 0.25))  # the work: kills land in here
        async with transaction:
            await connection.execute("BEGIN IMMEDIATE")
            try:
                await connection.execute(
                    "INSERT INTO effects (event, n) VALUES (?, 1)"
                    " ON CONFLICT (event) DO UPDATE SET n = n + 1",
                    (event,),
                )
                execution = current_execution()
                assert execution is not None
                await execution.settle(b"done", connection=connection)  # fenced: LeaseLostError
                await connection.execute("COMMIT")
            except BaseException:
                await connection.execute("ROLLBACK")
                raise

    consume = _CONSUMERS[broker]
    await consume(door, address, handler, lease)


async def _consume_sqs(door: Any, address: str, handler: Any, lease: float) -> None:
    from aiobotocore.session import get_session

    from idemstore.consumers.sqs import SQSConsumer

    async with get_session().create_client(
        "sqs", region_name="us-east-1", endpoint_url=address
    ) as sqs:
        url = (await sqs.get_queue_url(QueueName=NAME))["QueueUrl"]
        consumer = SQSConsumer(door, sqs, url, handler, batch_size=5, wait_time=0, idle_delay=0.05)
        await consumer.run()


async def _consume_redis(door: Any, address: str, handler: Any, lease: float) -> None:
    import redis.asyncio

    from idemstore.consumers.redis_streams import RedisStreamConsumer

    client = redis.asyncio.Redis.from_url(address)
    consumer = RedisStreamConsumer(
        door, client, NAME, "workers", f"w-{os.getpid()}", handler, count=5, block=0.1
    )
    await consumer.run()


async def _consume_rabbitmq(door: Any, address: str, handler: Any, lease: float) -> None:
    import aio_pika

    from idemstore.consumers.rabbitmq import RabbitMQConsumer

    # A short heartbeat: the broker notices a stopped consumer and redelivers its messages.
    connection = await aio_pika.connect(f"{address}?heartbeat=1")
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=5)
    queue = await channel.declare_queue(NAME, durable=True)
    async with RabbitMQConsumer(door, queue, handler):
        await asyncio.Event().wait()


async def _consume_nats(door: Any, address: str, handler: Any, lease: float) -> None:
    import nats

    from idemstore.consumers.nats import JetStreamConsumer

    connection = await nats.connect(address)
    consumer = JetStreamConsumer(
        door,
        connection.jetstream(),
        f"{NAME}.new",
        "workers",
        handler,
        batch=5,
        fetch_timeout=0.2,
    )
    await consumer.run()


_CONSUMERS: dict[str, Callable[..., Any]] = {
    "sqs": _consume_sqs,
    "redis": _consume_redis,
    "rabbitmq": _consume_rabbitmq,
    "nats": _consume_nats,
}


# ---------------------------------------------------------------------------- the brokers


class _Broker:
    """One broker for a run: started, set up, produced to, and asked whether it is idle."""

    def __init__(self, name: str, lease: float) -> None:
        self.name = name
        self.lease = lease
        self.server: Any = None

    def start(self, directory: Path) -> str:
        if self.name == "sqs":
            from idemstore.local_servers.dynamodb import start_dynamodb

            os.environ.update(
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_DEFAULT_REGION="us-east-1",
            )
            self.server = start_dynamodb(directory)
        elif self.name == "redis":
            from idemstore.local_servers.redis import start_redis

            self.server = start_redis()
        elif self.name == "rabbitmq":
            from idemstore.local_servers.rabbitmq import start_rabbitmq

            self.server = start_rabbitmq()
        else:
            from idemstore.local_servers.nats import start_nats

            self.server = start_nats()
        address: str = self.server.url
        self.address = address
        return address

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    async def setup(self) -> None:
        if self.name == "sqs":
            async with self._sqs() as sqs:
                # The broker's deadline is the lease's (whole seconds for SQS).
                await sqs.create_queue(QueueName=NAME)
        elif self.name == "redis":
            client = self._redis()
            await client.xgroup_create(NAME, "workers", id="0", mkstream=True)
            await client.aclose()
        elif self.name == "rabbitmq":
            import aio_pika

            connection = await aio_pika.connect(self.address)
            channel = await connection.channel()
            await channel.declare_queue(NAME, durable=True)
            await connection.close()
        else:
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig

            connection = await nats.connect(self.address)
            js = connection.jetstream()
            await js.add_stream(name=NAME, subjects=[f"{NAME}.>"])
            await js.add_consumer(
                NAME,
                ConsumerConfig(
                    durable_name="workers", ack_policy=AckPolicy.EXPLICIT, ack_wait=self.lease
                ),
            )
            await connection.close()

    def _sqs(self) -> Any:
        from aiobotocore.session import get_session

        return get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=self.address
        )

    def _redis(self) -> Any:
        import redis.asyncio

        return redis.asyncio.Redis.from_url(self.address)

    async def produce(self, bodies: list[bytes], pace: float) -> None:
        """Send ``bodies`` in order, ``pace`` seconds apart."""
        if self.name == "sqs":
            async with self._sqs() as sqs:
                url = (await sqs.get_queue_url(QueueName=NAME))["QueueUrl"]
                for body in bodies:
                    await sqs.send_message(QueueUrl=url, MessageBody=body.decode())
                    await asyncio.sleep(pace)
        elif self.name == "redis":
            client = self._redis()
            for body in bodies:
                await client.xadd(NAME, {"body": body})
                await asyncio.sleep(pace)
            await client.aclose()
        elif self.name == "rabbitmq":
            import aio_pika

            connection = await aio_pika.connect(self.address)
            channel = await connection.channel()
            for n, body in enumerate(bodies):
                await channel.default_exchange.publish(
                    aio_pika.Message(body, message_id=f"m-{n}"), routing_key=NAME
                )
                await asyncio.sleep(pace)
            await connection.close()
        else:
            import nats

            connection = await nats.connect(self.address)
            js = connection.jetstream()
            for body in bodies:
                await js.publish(f"{NAME}.new", body)
                await asyncio.sleep(pace)
            await connection.close()

    async def in_flight(self) -> int:
        """Messages the broker still holds: ready, delivered and unacknowledged, or pending."""
        if self.name == "sqs":
            async with self._sqs() as sqs:
                url = (await sqs.get_queue_url(QueueName=NAME))["QueueUrl"]
                counts = (
                    await sqs.get_queue_attributes(
                        QueueUrl=url,
                        AttributeNames=[
                            "ApproximateNumberOfMessages",
                            "ApproximateNumberOfMessagesNotVisible",
                        ],
                    )
                )["Attributes"]
                return sum(int(v) for v in counts.values())
        if self.name == "redis":
            client = self._redis()
            try:
                (group,) = await client.xinfo_groups(NAME)
                last = (await client.xinfo_stream(NAME))["last-generated-id"]
                unread = 0 if group["last-delivered-id"] == last else 1
                return int(group["pending"]) + unread
            finally:
                await client.aclose()
        if self.name == "rabbitmq":
            listing = self.server.ctl("list_queues", "name", "messages")
            for line in listing.splitlines():
                parts = line.split()
                if parts and parts[0] == NAME:
                    return int(parts[1])
            return 0
        import nats

        connection = await nats.connect(self.address)
        info = await connection.jetstream().consumer_info(NAME, "workers")
        await connection.close()
        return int(info.num_pending) + int(info.num_ack_pending)


# ---------------------------------------------------------------------------- the campaign


def _spawn(broker: str, address: str, db: Path, lease: float, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.consumer_crashes",
                "--worker",
                broker,
                "--address",
                address,
                "--db",
                str(db),
                "--lease",
                str(lease),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait()


def campaign(
    broker: str,
    *,
    events: int = 30,
    workers: int = 3,
    kills: int = 3,
    pauses: int = 2,
    lease: float = 1.0,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run one broker's campaign; the history check's counts (``ok`` when it passed)."""
    from idemstore.backends.schema import run_schema

    started = time.monotonic()
    target = _Broker(broker, lease)
    with tempfile.TemporaryDirectory(prefix=f"crashes-{broker}-") as tmp:
        directory = Path(tmp)
        db = directory / "idem.db"
        url = f"sqlite:///{db}"
        asyncio.run(run_schema(url, "apply"))
        with sqlite3.connect(db) as setup:
            setup.executescript(TABLES)
        address = target.start(directory)
        log = directory / "workers.log"
        running: list[subprocess.Popen[bytes]] = []
        done_kills = done_pauses = 0
        try:
            asyncio.run(target.setup())
            running = [_spawn(broker, address, db, lease, log) for _ in range(workers)]
            names = [f"e-{n}" for n in range(events)]
            # Every event twice; a duplicate may come at once or much later.
            bodies = [json.dumps({"event": name}).encode() for name in names * 2]
            random.shuffle(bodies)
            chaos_seconds = (kills + pauses) * 0.5 + pauses * _pause(broker, lease)
            pace = min(0.2, chaos_seconds / max(1, len(bodies)))
            producer = _in_thread(target.produce(bodies, pace))
            time.sleep(0.5)  # the workers are consuming
            faults = ["kill"] * kills + ["pause"] * pauses
            random.shuffle(faults)
            for fault in faults:
                time.sleep(random.uniform(0.2, 0.6))
                victim = _mid_handler(db, running)
                if fault == "kill":
                    running[victim].kill()
                    running[victim].wait()
                    running[victim] = _spawn(broker, address, db, lease, log)
                    done_kills += 1
                else:
                    running[victim].send_signal(signal.SIGSTOP)
                    time.sleep(_pause(broker, lease))
                    running[victim].send_signal(signal.SIGCONT)
                    done_pauses += 1
            producer.join()
            deadline = time.monotonic() + timeout
            effects = held = -1
            while time.monotonic() < deadline:
                effects = _count(db, "SELECT count(*) FROM effects")
                held = asyncio.run(target.in_flight())
                if effects == events and held == 0:
                    break
                time.sleep(0.5)
        finally:
            for process in running:
                _stop(process)
            counts = _history(db, events)
            target.stop()
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    counts.update(
        broker=broker,
        workers=workers,
        kills=done_kills,
        pauses=done_pauses,
        lease=lease,
        in_flight=held,
        seconds=round(time.monotonic() - started, 1),
    )
    counts["ok"] = (
        counts["exactly_once"] == events
        and counts["lost"] == 0
        and counts["twice"] == 0
        and held == 0
    )
    if not counts["ok"]:
        counts["log_tail"] = tail
    return counts


def _mid_handler(db: Path, running: list[subprocess.Popen[bytes]]) -> int:
    """The index of a worker that started a handler not yet committed (a random one if none
    is found): faults should land mid-handler."""
    with sqlite3.connect(db, timeout=60) as connection:
        rows = connection.execute(
            "SELECT pid FROM attempts a WHERE NOT EXISTS"
            " (SELECT 1 FROM effects e WHERE e.event = a.event) ORDER BY rowid DESC LIMIT 20"
        ).fetchall()
    pids = [process.pid for process in running]
    for (pid,) in rows:
        if pid in pids:
            return pids.index(pid)
    return random.randrange(len(running))


def _pause(broker: str, lease: float) -> float:
    """How long a paused worker stays stopped: past its lease and the broker's deadline
    (RabbitMQ's is the connection heartbeat's timeout, about two 1 s heartbeats)."""
    return max(3 * lease, 4.0 if broker == "rabbitmq" else 0.0, 2.5)


def _count(db: Path, query: str) -> int:
    with sqlite3.connect(db, timeout=60) as connection:
        value: int = connection.execute(query).fetchone()[0]
    return value


def _history(db: Path, events: int) -> dict[str, Any]:
    with sqlite3.connect(db, timeout=60) as connection:
        effects = dict(connection.execute("SELECT event, n FROM effects").fetchall())
        attempts = connection.execute("SELECT count(*) FROM attempts").fetchone()[0]
        # Events whose handler started more than once (cut short, then run again).
        retried = connection.execute(
            "SELECT count(*) FROM (SELECT event FROM attempts GROUP BY event HAVING count(*) > 1)"
        ).fetchone()[0]
    names = [f"e-{n}" for n in range(events)]
    return {
        "events": events,
        "messages": 2 * events,
        "exactly_once": sum(1 for name in names if effects.get(name) == 1),
        "twice": sum(1 for n in effects.values() if n > 1),
        "lost": sum(1 for name in names if name not in effects),
        # Handler starts: more than the events when kills and pauses cut handlers short.
        "attempts": attempts,
        "retried": retried,
    }


class _Thread:
    def __init__(self, coroutine: Any) -> None:
        import threading

        self._error: BaseException | None = None

        def run() -> None:
            try:
                asyncio.run(coroutine)
            except BaseException as exc:  # reported by join
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _in_thread(coroutine: Any) -> _Thread:
    return _Thread(coroutine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", choices=BROKERS, action="append")
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--pauses", type=int, default=8)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=BROKERS, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args.worker, args.address, args.db, args.lease))
        return 0
    results = []
    for broker in args.broker or BROKERS:
        result = campaign(
            broker,
            events=args.events,
            workers=args.workers,
            kills=args.kills,
            pauses=args.pauses,
            lease=args.lease,
            timeout=args.timeout,
        )
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}), flush=True)
        if not result["ok"]:
            print(result.get("log_tail", ""), file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
