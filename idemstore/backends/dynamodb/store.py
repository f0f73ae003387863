"""The DynamoDB store: the client, URL options, and the contract as conditional writes.

Every operation is one HTTP request on one long-lived aiobotocore client: ``reserve`` is a
conditional ``UpdateItem`` (it continues the fence in the same request, which a ``PutItem``
cannot) after a ``PutItem`` first claim (``first_claims``); ``complete``, ``release`` and
``extend`` are ``UpdateItem`` conditioned on token and fence (a lease this store acquired
completes by a conditional ``PutItem``: ``whole_completions``); ``get`` is a ``GetItem`` with
``ConsistentRead``, ``delete`` a ``DeleteItem``. Times
come from the client's clock; ``clock_skew`` (seconds) is the margin by which every deadline
is pushed out before it counts as passed. See docs/backends/dynamodb.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from idemstore.backends.arguments import retention_while_held
from idemstore.backends.backoff import NO_PAUSE, retrying
from idemstore.backends.dynamodb.client_errors import driver_errors
from idemstore.backends.dynamodb.first_claims import FirstClaims, landed
from idemstore.backends.dynamodb.holder_writes import HolderWrites
from idemstore.backends.dynamodb.item_limit import (
    checkpoint_bytes,
    checkpoint_too_large,
    response_bytes,
    response_too_large,
)
from idemstore.backends.dynamodb.items import (
    CHECKPOINT_CONDITION,
    CHECKPOINT_UPDATE,
    COMPLETE_UPDATE,
    DROP_CHECKPOINTS_UPDATE,
    EXTEND_CONDITION,
    EXTEND_UPDATE,
    HOLDER_CONDITION,
    HOLDER_NAMES,
    RELEASE_UPDATE,
    RESERVE_CONDITION,
    RESERVE_NAMES,
    RESERVE_UPDATE,
    decode_record,
    encode_response,
    error_code,
    integer,
    item_checkpoints,
    names,
    number,
    partition_key,
    text,
)
from idemstore.backends.dynamodb.listing import listed
from idemstore.backends.dynamodb.options import CHAIN, OPTIONS, check_region
from idemstore.backends.dynamodb.stats import count
from idemstore.backends.dynamodb.table import Table
from idemstore.backends.dynamodb.whole_completions import WholeCompletions
from idemstore.backends.envelope import StoreEnvelope, lost_reserve
from idemstore.backends.urls import parse_store_url, redact_url
from idemstore.backends.waiting import Sighting, wait_for_holder
from idemstore.checkpoints import encode_checkpoint
from idemstore.errors import ConfigurationError, StoreUnavailableError
from idemstore.protocol import Lease, Outcome, Record, Reservation, Status
from idemstore.records import MAX_KEY_LENGTH, new_token

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from idemstore.backends.stats import StoreStats
    from idemstore.records import RecordQuery

__all__ = ["DynamoDBStore"]

_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
# DynamoDB numbers stop at 9.99e125; deadlines are clamped to the year 9999.
_MAX_DEADLINE = 253402300799.0
# A reserve whose condition failed on an item that was gone (or reservable) by the time it
# was read tries again, at most this many times in all.
_RESERVE_ATTEMPTS = 5


class _Client(NamedTuple):
    """The aiobotocore client, and the exit stack that closes it."""

    client: Any
    stack: contextlib.AsyncExitStack


class _Rewritten(Exception):
    """A reserve's condition failed on an item that changed before it could be read."""


def _rewritten(exc: Exception) -> bool:
    return isinstance(exc, _Rewritten)


class DynamoDBStore(StoreEnvelope[_Client]):
    """Records as items of one DynamoDB table, one request per operation.

    Build it with ``open_store("dynamodb://TABLE?region=…")`` or ``DynamoDBStore.from_url``.
    ``session`` (an ``aiobotocore`` session) and ``clock`` (epoch seconds) may be injected.
    """

    __slots__ = (
        "_auto_create",
        "_call_timeout",
        "_clock",
        "_completions",
        "_compress_min_bytes",
        "_config",
        "_endpoint_url",
        "_errors",
        "_first_claims",
        "_holder",
        "_profile",
        "_region",
        "_session",
        "_skew",
        "_table",
        "_tables",
        "_url",
        "_where",
    )

    def __init__(
        self,
        table: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        auto_create: bool = False,
        clock_skew: float = 0.1,
        compress_min_bytes: int = 1024,
        max_attempts: int = 3,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        call_timeout: float = 8.0,
        max_pool_connections: int = 50,
        max_key_length: int = MAX_KEY_LENGTH,
        session: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        given = OPTIONS.check(locals())
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise ConfigurationError(
                f"DynamoDB table name {table!r} is invalid: 3 to 255 characters of "
                "A-Z a-z 0-9 _ . -"
            )
        check_region(region, endpoint_url)
        super().__init__(max_key_length=given["max_key_length"])
        self._table = table
        self._region = region
        self._endpoint_url = endpoint_url
        self._profile = profile
        self._auto_create = auto_create
        self._skew: float = given["clock_skew"]
        self._compress_min_bytes = compress_min_bytes
        self._config = {
            # "standard" retries throttling and transient errors with backoff; past
            # max_attempts the error surfaces as StoreUnavailableError. botocore's own
            # "max_attempts" key counts retries only (one attempt more than asked for).
            "retries": {"total_max_attempts": max_attempts, "mode": "standard"},
            "connect_timeout": given["connect_timeout"],
            "read_timeout": given["read_timeout"],
            "max_pool_connections": max_pool_connections,
        }
        # Without it, read_timeout times max_attempts plus backoff: about 17 s by default.
        self._call_timeout: float = given["call_timeout"]
        self._session = session
        self._clock = clock
        self._url = f"dynamodb://{table}"
        where = f"DynamoDB table {table!r}"
        if endpoint_url:
            where += f" at {redact_url(endpoint_url)}"
        self._where = where
        self._errors = driver_errors(where, self._url)
        self._tables = Table(table, self._url, self._errors)
        self._holder = HolderWrites(self._call, clock, self._skew)
        self._first_claims = FirstClaims(self._call, self._failed_item, self._live, self._skew)
        self._completions = WholeCompletions(self._call, self._failed_item, self._skew)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``dynamodb://TABLE``; options: those of ``OPTIONS`` (``session`` and ``clock`` as
        keywords only)."""
        parsed = parse_store_url(url, options)
        if parsed.username is not None or parsed.password is not None or parsed.port is not None:
            # Not a table name; and the error must not echo a password.
            raise ConfigurationError(
                "a DynamoDB store URL takes no user, password or port (credentials come from "
                f"the AWS chain): dynamodb://TABLE?region=..., not {redact_url(url)!r}"
            )
        if parsed.path not in ("", "/") or not parsed.netloc:
            raise ConfigurationError(
                f"a DynamoDB store URL names its table: dynamodb://TABLE?region=..., "
                f"not {redact_url(url)!r}"
            )
        return cls(parsed.netloc, **OPTIONS.from_url(parsed))

    # -- connection --------------------------------------------------------------------------

    async def _open(self) -> _Client:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession

        session = self._session or AioSession(profile=self._profile)
        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(
                session.create_client(
                    "dynamodb",
                    region_name=self._region,
                    endpoint_url=self._endpoint_url,
                    config=AioConfig(**self._config),
                )
            )
            # The region may come from the AWS chain: checked before the first request,
            # which would report a bad one as an unreachable endpoint.
            found_in = "" if self._region else CHAIN
            check_region(client.meta.region_name, self._endpoint_url, found_in=found_in)
        except Exception as exc:
            await stack.aclose()
            raise self._errors.translate(exc) from exc
        if self._auto_create:
            try:
                await self._tables.create(client)
            except BaseException:
                await stack.aclose()
                raise
        return _Client(client, stack)

    async def _discard(self, connection: _Client) -> None:
        await connection.stack.aclose()

    async def _disconnect(self, connection: _Client | None) -> None:
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.stack.aclose()

    async def _client(self) -> Any:
        connection = self._connection
        if connection is None:
            connection = await self._connect()
        return connection.client

    async def _call(self, operation: str, **request: Any) -> dict[str, Any]:
        """One request; every driver error mapped (``ConditionalCheckFailedException`` is
        left to the caller, which needs its ``Item``)."""
        try:
            async with asyncio.timeout(self._call_timeout):
                client = await self._client()
                try:
                    response: dict[str, Any] = await getattr(client, operation)(
                        TableName=self._table, **request
                    )
                except Exception as exc:
                    if error_code(exc) == "ConditionalCheckFailedException":
                        raise
                    raise self._errors.translate(exc) from exc
        except TimeoutError as exc:
            raise StoreUnavailableError(
                f"{self._where} did not answer within call_timeout ({self._call_timeout:g} s,"
                " every attempt included): is the endpoint up? Raise call_timeout if it is slow"
            ) from exc
        return response

    # -- encoding ----------------------------------------------------------------------------

    def _horizon(self, now: float) -> dict[str, str]:
        return number(now - self._skew)

    def _ttl(self, expires_at: float) -> dict[str, str]:
        return integer(math.ceil(expires_at + self._skew))

    def _live(self, item: Mapping[str, Any] | None, now: float) -> bool:
        return (
            item is not None
            and "status" in item
            and item["status"]["S"] != "released"
            and float(item["expires_at"]["N"]) > now - self._skew
        )

    def storage_key(self, scope: str, key: str) -> dict[str, dict[str, str]]:
        """The primary key of ``(scope, key)``'s item (for an operator or a meter)."""
        return partition_key(scope, key)

    # -- the contract ------------------------------------------------------------------------

    async def _reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        try:
            return await retrying(
                lambda: self._try_reserve(key, fingerprint, scope, lease_ttl, retention),
                retry_on=_rewritten,
                backoff=NO_PAUSE,
                attempts=_RESERVE_ATTEMPTS,
            )
        except _Rewritten:
            raise StoreUnavailableError(
                f"reserve of {key!r} kept failing its condition without a readable record "
                f"({_RESERVE_ATTEMPTS} attempts): the item is being rewritten concurrently"
            ) from None

    async def _try_reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation:
        now = self._clock()
        token = new_token()
        expires_at = min(now + retention_while_held(lease_ttl, retention), _MAX_DEADLINE)
        lease_expires_at = min(now + lease_ttl, _MAX_DEADLINE)
        claim = Lease(scope, key, token, 1, lease_expires_at, retention)
        found = await self._first_claims.claim(
            claim, fingerprint, now, expires_at, self._ttl(expires_at)
        )
        if found is not None:
            if found.lease is not None:
                self._held(found.lease, fingerprint, now)
            return found
        try:
            response = await self._call(
                "update_item",
                Key=partition_key(scope, key),
                UpdateExpression=RESERVE_UPDATE,
                ConditionExpression=RESERVE_CONDITION,
                ExpressionAttributeNames=names(*RESERVE_NAMES),
                ExpressionAttributeValues={
                    ":scope": text(scope),
                    ":key": text(key),
                    ":fp": text(fingerprint),
                    ":in_progress": text(Status.IN_PROGRESS.value),
                    ":released": text("released"),
                    ":token": text(token),
                    ":now": number(now),
                    ":exp": number(expires_at),
                    ":lease": number(lease_expires_at),
                    ":ttl": self._ttl(expires_at),
                    ":horizon": self._horizon(now),
                    ":zero": integer(0),
                    ":one": integer(1),
                },
                # The old item tells us the fence we just raised and whether it was a takeover.
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            existing = await self._failed_item(exc, scope, key)
            if existing is None:
                raise _Rewritten from exc  # gone between the write and the read: try again
            if existing.get("token", {}).get("S") == token:
                found = landed(existing, claim)
                if found.lease is not None and not item_checkpoints(existing):
                    self._held(found.lease, fingerprint, now)
                return found
            if not self._live(existing, now):
                # Became reservable after our condition was evaluated: try again.
                raise _Rewritten from exc
            return lost_reserve(decode_record(existing), fingerprint)
        old = response.get("Attributes")
        fence = int(old["fence"]["N"]) + 1 if old and "fence" in old else 1
        takeover = bool(
            old and self._live(old, now) and old["status"]["S"] == Status.IN_PROGRESS.value
        )
        lease = Lease(scope, key, token, fence, lease_expires_at, retention)
        kept = item_checkpoints(old) if old else ()
        self._first_claims.held(scope, key)
        if not (kept and takeover):
            self._completions.acquired(lease, fingerprint, now)
        if kept and not takeover:
            # One update cannot keep checkpoints for a takeover only: a record past retention
            # that held some is acquired afresh, so drop them before the owner starts.
            await self._holder.write(
                lease, DROP_CHECKPOINTS_UPDATE, HOLDER_CONDITION, (*HOLDER_NAMES, "#cp"), {}, now
            )
            kept = ()
        return Reservation(Outcome.ACQUIRED, lease=lease, takeover=takeover, checkpoints=kept)

    def _held(self, lease: Lease, fingerprint: str, created_at: float) -> None:
        """This store acquired ``lease``, stored with no checkpoints."""
        self._first_claims.held(lease.scope, lease.key)
        self._completions.acquired(lease, fingerprint, created_at)

    async def _failed_item(self, exc: Exception, scope: str, key: str) -> Mapping[str, Any] | None:
        """The item a conditional write failed on (``ALL_OLD``); re-raise anything else.

        Endpoints that ignore ``ReturnValuesOnConditionCheckFailure`` (older DynamoDB Local)
        get one consistent ``GetItem`` instead.
        """
        if error_code(exc) != "ConditionalCheckFailedException":
            raise exc
        item: Mapping[str, Any] | None = getattr(exc, "response", {}).get("Item")
        if item is None:
            read = await self._call("get_item", Key=partition_key(scope, key), ConsistentRead=True)
            item = read.get("Item")
        return item

    async def _complete(self, lease: Lease, response: bytes, retention: float) -> bool:
        stored, compressed = encode_response(response, self._compress_min_bytes)
        now = self._clock()
        expires_at = min(now + retention, _MAX_DEADLINE)
        besides = response_bytes(lease, stored)
        too_large = response_too_large(response, stored, compressed)
        # A lease this store acquired itself: one PutItem of the whole record, else the update.
        landed = await self._completions.complete(
            lease, stored, compressed, now, expires_at, self._ttl(expires_at), besides, too_large
        )
        if landed is None:
            landed = await self._holder.within_limit(
                lease,
                COMPLETE_UPDATE,
                HOLDER_CONDITION,
                (*HOLDER_NAMES, "#response", "#compressed", "#ttl", "#lease"),
                {
                    ":completed": text(Status.COMPLETED.value),
                    ":response": {"B": stored},
                    ":compressed": {"BOOL": compressed},
                    ":exp": number(expires_at),
                    ":ttl": self._ttl(expires_at),
                },
                besides,
                too_large,
            )
        if landed:
            self._first_claims.completed(lease.scope, lease.key)
        return landed

    async def _checkpoint(self, lease: Lease, name: str, data: bytes) -> bool:
        entry = encode_checkpoint(name, data)
        self._completions.forget(lease)  # the record will hold more than it knows
        return await self._holder.within_limit(
            lease,
            CHECKPOINT_UPDATE,
            CHECKPOINT_CONDITION,
            HOLDER_NAMES,
            {":entry": {"L": [{"B": entry}]}, ":empty": {"L": []}},
            checkpoint_bytes(lease, entry),
            checkpoint_too_large(lease, name, data),
        )

    async def _release(self, lease: Lease) -> bool:
        self._completions.forget(lease)
        return await self._holder.write(
            lease,
            RELEASE_UPDATE,
            HOLDER_CONDITION,
            (*HOLDER_NAMES, "#lease", "#cp"),
            {":released": text("released")},
            self._clock(),
        )

    async def _extend(self, lease: Lease, lease_ttl: float) -> Lease | None:
        now = self._clock()
        deadline = min(now + lease_ttl, _MAX_DEADLINE)
        expires_at = min(now + retention_while_held(lease_ttl, lease.retention), _MAX_DEADLINE)
        extended = await self._holder.write(
            lease,
            EXTEND_UPDATE,
            EXTEND_CONDITION,
            (*HOLDER_NAMES, "#lease", "#ttl"),
            {":lease": number(deadline), ":exp": number(expires_at), ":ttl": self._ttl(expires_at)},
            now,
        )
        if not extended:
            return None
        return Lease(lease.scope, lease.key, lease.token, lease.fence, deadline, lease.retention)

    async def _get(self, key: str, scope: str) -> Record | None:
        return (await self._read(key, scope)).record

    async def _read(self, key: str, scope: str) -> Sighting:
        response = await self._call("get_item", Key=partition_key(scope, key), ConsistentRead=True)
        item = response.get("Item")
        now = self._clock()
        record = decode_record(item) if item is not None and self._live(item, now) else None
        # A lease counts as lapsed once the skew margin has passed too (as for takeover).
        return Sighting(record, now - self._skew)

    async def _wait(self, key: str, scope: str, timeout: float) -> Record | None:
        """DynamoDB cannot push: the shared loop polls with capped backoff, every read bounded
        by the time left (the SDK's timeouts and retries could otherwise hold one far past
        ``timeout``)."""
        return await wait_for_holder(
            lambda: self._read(key, scope), timeout=timeout, unavailable=self._errors.translate
        )

    async def _delete(self, key: str, scope: str) -> bool:
        response = await self._call(
            "delete_item", Key=partition_key(scope, key), ReturnValues="ALL_OLD"
        )
        return self._live(response.get("Attributes"), self._clock())

    async def _sweep(self, limit: int) -> int:
        """Delete up to ``limit`` items past retention, found by a ``Scan`` of the table.

        With DynamoDB TTL enabled this is never needed (reads already hide expired items):
        it costs a read of the whole table. Each delete is conditioned on the item still
        being expired.
        """
        return await self._tables.sweep(self._call, self._horizon(self._clock()), limit)

    async def _ping(self) -> None:
        # A data-plane read of an item that never exists: proves endpoint, credentials and
        # table (DescribeTable has a far lower rate limit).
        await self._call(
            "get_item",
            Key={"pk": {"S": "idemstore-ping"}},
            ProjectionExpression="#pk",
            ExpressionAttributeNames=names("#pk"),
        )

    async def _stats(self, limit: int) -> StoreStats:
        """One projected ``Scan`` of at most ``limit`` items (see ``dynamodb.stats``)."""
        # Deadlines count as passed by the same margin every read applies (clock_skew).
        return await count(self._call, self._clock() - self._skew, limit)

    def _records(self, query: RecordQuery) -> AsyncIterator[Record]:
        """A paged ``Scan`` with a filter (see ``dynamodb.listing``)."""
        return listed(self._call, self._clock() - self._skew, query)

    async def _enter(self) -> None:
        # Fail at startup, not on the first request, when the endpoint, the credentials or
        # the table are wrong.
        await self._connect()
        await self._ping()

    # -- the table (for `idemstore migrate`) ------------------------------------------------

    def table_definition(self) -> dict[str, Any]:
        """The table as JSON: the ``CreateTable`` request plus ``TimeToLiveSpecification``,
        which is also the shape of a CloudFormation ``AWS::DynamoDB::Table``'s Properties."""
        return self._tables.definition()

    async def table_status(self) -> dict[str, Any]:
        """``{"table", "exists", "status", "key_schema_ok", "ttl_enabled", "ttl_attribute",
        "billing_mode"}``; a missing table gives ``exists: False`` (and no error)."""
        return await self._tables.status(await self._client())

    async def create_table(self) -> bool:
        """Create the table (on-demand billing), wait until it is active, enable TTL; False
        when it already existed as needed. Another key schema raises ``SchemaError``."""
        return await self._tables.create(await self._client())
