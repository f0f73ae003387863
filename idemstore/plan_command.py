"""``idemstore plan``: the capacity and cost model on the command line.

The model is ``idemstore.bench.capacity_plan`` (imported when the command runs, so the CLI
starts without it); this module only reads the workload and the overrides from arguments and
prints the model's table (docs/capacity.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from idemstore.argument_types import non_negative_int, positive_float
from idemstore.errors import ConfigurationError

__all__ = ["add_plan_parser"]


def _duration(text: str) -> float:
    from idemstore.bench.capacity_plan import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_plan_parser(commands: Any) -> None:
    """``idemstore plan``, on the CLI's subcommands."""
    plan = commands.add_parser(
        "plan",
        help="what a workload needs of each engine: storage, operations, shards, cost",
        description=(
            "Records held, memory or storage, operations a second, Redis Cluster shards,"
            " PostgreSQL's sweep rate, DynamoDB's monthly cost, and where each engine stops"
            " being the right choice, from the costs the `cost` bench scenario measured"
            " (docs/capacity.md)."
        ),
    )
    add = plan.add_argument
    add("--rps", type=positive_float, required=True, metavar="N", help="keyed requests a second")
    add("--retention", type=_duration, default=86400.0, metavar="D", help="24h (default), 7d, …")
    add("--response-bytes", type=non_negative_int, default=1024, metavar="B", help="default 1024")
    add("--retry-rate", type=float, default=0.05, metavar="R", help="retried share (default 0.05)")
    add("--engine", action="append", metavar="E", help="only this engine (repeatable)")
    add("--redis-calls-per-core", type=positive_float, metavar="N", help="instead of measured")
    add("--redis-shard-gb", type=positive_float, default=25.0, metavar="GB", help="default 25")
    add("--dynamodb-write-price", type=positive_float, metavar="USD", help="per million WRU")
    add("--dynamodb-wcu-hour", type=positive_float, metavar="USD", help="per WCU-hour")
    add("--dynamodb-gb-month", type=positive_float, metavar="USD", help="per GB-month")
    plan.set_defaults(handler=_plan)


async def _plan(args: argparse.Namespace) -> int:
    from idemstore.bench import capacity_plan as model

    prices = model.with_overrides(
        model.DYNAMODB_PRICES,
        per_million_write_request_units=args.dynamodb_write_price,
        per_wcu_hour=args.dynamodb_wcu_hour,
        per_gb_month=args.dynamodb_gb_month,
    )
    redis = model.RedisAssumptions(args.redis_calls_per_core, args.redis_shard_gb * 1e9)
    try:
        workload = model.Workload(args.rps, args.retention, args.response_bytes, args.retry_rate)
        plans = model.plan(workload, args.engine, prices=prices, redis=redis)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    sys.stdout.write(model.render(workload, plans))
    return 0
