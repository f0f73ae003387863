"""The DynamoDB table a store keeps its items in: its definition, its status, and creating it
(what ``idemstore migrate dynamodb://TABLE`` runs)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from idemstore.backends.dynamodb.items import SWEEP_FILTER, TTL_ATTRIBUTE, error_code, names
from idemstore.errors import SchemaError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    # The store's request function: one operation name and its parameters, the answer back.
    Call = Callable[..., Awaitable[dict[str, Any]]]

    from idemstore.backends.driver_errors import DriverErrors

__all__ = ["SWEEP_CONCURRENCY", "Table"]

# How many conditional deletes one sweep keeps in flight.
SWEEP_CONCURRENCY = 16


class Table:
    """One table by name; ``url`` is the store URL shown in messages (no credentials)."""

    __slots__ = ("errors", "name", "url")

    def __init__(self, name: str, url: str, errors: DriverErrors) -> None:
        self.name = name
        self.url = url
        self.errors = errors

    def definition(self) -> dict[str, Any]:
        """The table as JSON: the ``CreateTable`` request plus ``TimeToLiveSpecification``,
        which is also the shape of a CloudFormation ``AWS::DynamoDB::Table``'s Properties."""
        return {
            "TableName": self.name,
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
        }

    async def status(self, client: Any) -> dict[str, Any]:
        """``{"table", "exists", "status", "key_schema_ok", "ttl_enabled", "ttl_attribute",
        "billing_mode"}``; a missing table gives ``exists: False`` (and no error)."""
        status: dict[str, Any] = {
            "table": self.name,
            "exists": False,
            "status": None,
            "key_schema_ok": False,
            "ttl_enabled": False,
            "ttl_attribute": None,
            "billing_mode": None,
        }
        try:
            described = (await client.describe_table(TableName=self.name))["Table"]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return status
            raise self.errors.translate(exc) from exc
        status.update(
            exists=True,
            status=described.get("TableStatus"),
            key_schema_ok=_key_schema_ok(described),
            billing_mode=described.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED"),
        )
        try:
            ttl = (await client.describe_time_to_live(TableName=self.name))["TimeToLiveDescription"]
        except Exception as exc:
            raise self.errors.translate(exc) from exc
        status["ttl_enabled"] = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        status["ttl_attribute"] = ttl.get("AttributeName")
        return status

    async def create(self, client: Any) -> bool:
        """Create the table (on-demand billing), wait until it is active, enable TTL.

        Returns ``False`` when the table already existed with the right key schema and TTL
        (nothing to do), ``True`` when it created the table or enabled TTL. A table of that
        name with another key schema raises ``SchemaError``.
        """
        current = await self.status(client)
        changed = False
        if not current["exists"]:
            request = self.definition()
            request.pop("TimeToLiveSpecification")
            try:
                await client.create_table(**request)
            except Exception as exc:
                # Another migrator may have created it a moment ago: that is fine.
                if error_code(exc) != "ResourceInUseException":
                    raise self.errors.translate(exc) from exc
            changed = True
        elif not current["key_schema_ok"]:
            raise SchemaError(
                f"DynamoDB table {self.name!r} exists with another key schema; idemstore "
                "needs a partition key 'pk' of type S and no sort key. Use another table name"
            )
        await self.wait_active(client)
        current = await self.status(client)
        if not current["ttl_enabled"]:
            try:
                await client.update_time_to_live(
                    TableName=self.name,
                    TimeToLiveSpecification={"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
                )
            except Exception as exc:
                raise self.errors.translate(exc) from exc
            changed = True
        elif current["ttl_attribute"] != TTL_ATTRIBUTE:
            raise SchemaError(
                f"DynamoDB table {self.name!r} has TTL on {current['ttl_attribute']!r}; "
                f"idemstore writes its expiry to {TTL_ATTRIBUTE!r}. Disable TTL on the table "
                f"and run `idemstore migrate {self.url}` again"
            )
        return changed

    async def wait_active(self, client: Any, timeout: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                described = (await client.describe_table(TableName=self.name))["Table"]
            except Exception as exc:
                if error_code(exc) != "ResourceNotFoundException":
                    raise self.errors.translate(exc) from exc
                described = {}
            if described.get("TableStatus") == "ACTIVE":
                return
            if loop.time() >= deadline:
                raise StoreUnavailableError(
                    f"DynamoDB table {self.name!r} did not become ACTIVE within {timeout:.0f}s"
                )
            await asyncio.sleep(1.0)

    async def sweep(self, call: Call, horizon: dict[str, str], limit: int) -> int:
        """Delete up to ``limit`` items whose retention ended at ``horizon``, found by a
        ``Scan`` through ``call`` (the store's one request function). Each delete is
        conditioned on the item still being expired, so a key reserved again meanwhile stays.
        """
        scanned = names("#pk", "#exp")
        found: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while len(found) < limit:
            page = await call(
                "scan",
                FilterExpression=SWEEP_FILTER,
                ProjectionExpression="#pk",
                ExpressionAttributeNames=scanned,
                ExpressionAttributeValues={":horizon": horizon},
                **({"ExclusiveStartKey": start} if start else {}),
            )
            found.extend(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        gate = asyncio.Semaphore(SWEEP_CONCURRENCY)

        async def remove(item: dict[str, Any]) -> bool:
            async with gate:
                try:
                    await call(
                        "delete_item",
                        Key={"pk": item["pk"]},
                        ConditionExpression=SWEEP_FILTER,
                        ExpressionAttributeNames=names("#exp"),
                        ExpressionAttributeValues={":horizon": horizon},
                    )
                except Exception as exc:
                    if error_code(exc) == "ConditionalCheckFailedException":
                        return False
                    raise
                return True

        # Every delete is awaited even when one fails: none is left running unobserved, and
        # the caller's error comes after the table stopped changing.
        results = await asyncio.gather(
            *(remove(item) for item in found[:limit]), return_exceptions=True
        )
        removed = sum(result is True for result in results)
        for result in results:
            if isinstance(result, BaseException):
                result.add_note(f"sweep removed {removed} expired items before this failure")
                raise result
        return removed


def _key_schema_ok(described: Mapping[str, Any]) -> bool:
    types = {a["AttributeName"]: a["AttributeType"] for a in described["AttributeDefinitions"]}
    return (
        described.get("KeySchema") == [{"AttributeName": "pk", "KeyType": "HASH"}]
        and types.get("pk") == "S"
    )
