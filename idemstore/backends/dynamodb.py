"""``dynamodb://TABLE?region=…&endpoint_url=…``: one item per record in a DynamoDB table.

Every operation is one HTTP request on one long-lived aiobotocore client: ``reserve`` is a
conditional ``UpdateItem`` (it continues the fence in the same request, which a ``PutItem``
cannot), ``complete``/``release``/``extend`` are ``UpdateItem`` conditioned on token and
fence, ``get`` is a ``GetItem`` with ``ConsistentRead``, ``delete`` a ``DeleteItem``. Times
come from the client's clock; ``clock_skew`` (seconds) is the margin by which every deadline
is pushed out before it counts as passed. See docs/backends/dynamodb.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import time
import zlib
from typing import TYPE_CHECKING, Any, Self

from idemstore.errors import (
    ConfigurationError,
    IdemstoreError,
    ResponseTooLargeError,
    SchemaError,
    StoreUnavailableError,
)
from idemstore.protocol import Lease, Outcome, Record, Reservation, Status
from idemstore.records import (
    MAX_FINGERPRINT_LENGTH,
    MAX_KEY_LENGTH,
    check_duration,
    check_identity,
    check_limit,
    check_response,
    check_timeout,
    new_token,
)
from idemstore.stats import DEFAULT_LIMIT, StatsTally, StoreStats
from idemstore.urls import parse_store_url, pop_bool, pop_float, pop_int, redact_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

__all__ = ["DynamoDBStore"]

# -- the item ------------------------------------------------------------------------------
#
# pk               S  SHA-256 (hex) of scope NUL key: fixed size whatever the scope and key
#                     (DynamoDB caps a partition key at 2048 bytes) and evenly spread over
#                     partitions; NUL cannot occur in either, so no two identities collide.
# scope, key       S  the identity as given, returned by reads
# fingerprint      S
# status           S  in_progress | completed | released (a tombstone that keeps the fence)
# token            S  owner token of the current or last lease
# fence            N  rises with every acquisition while the item exists
# created_at       N  epoch seconds (float)
# expires_at       N  retention deadline (float); past it the item is absent for every read
# lease_expires_at N  only while in progress
# response         B  only when completed; zlib-compressed when ``compressed`` is true
# compressed       BOOL
# ttl              N  whole epoch seconds for DynamoDB TTL: expires_at + clock_skew, rounded up
# op               S  nonce of the last complete/release/extend (see _confirmed_retry)

TTL_ATTRIBUTE = "ttl"
ITEM_LIMIT = 400 * 1024  # DynamoDB's item size limit, names and values together

_NAMES = {
    "#pk": "pk",
    "#scope": "scope",
    "#key": "key",
    "#fp": "fingerprint",
    "#status": "status",
    "#token": "token",
    "#fence": "fence",
    "#created": "created_at",
    "#exp": "expires_at",
    "#lease": "lease_expires_at",
    "#response": "response",
    "#compressed": "compressed",
    "#ttl": TTL_ATTRIBUTE,
    "#op": "op",
}

# ``:horizon`` is now - clock_skew: a deadline has passed once it is at or before it.

# Whom reserve may replace, in one atomic step: nobody (no item); a record past retention
# (absent to every read; TTL may not have deleted it yet); a released tombstone; or a lapsed
# lease of the *same* fingerprint (a takeover: a mismatch never takes a key over). Anything
# else fails the condition and comes back as ALL_OLD, so a lost race costs no GetItem.
RESERVE_CONDITION = (
    "attribute_not_exists(#pk)"
    " OR #exp <= :horizon"
    " OR #status = :released"
    " OR (#status = :in_progress AND #lease <= :horizon AND #fp = :fp)"
)
# The fence is read and raised inside the same write, so two reservers can never be handed
# the same fence, and a tombstone or expired item that still exists passes its fence on.
RESERVE_UPDATE = (
    "SET #scope = :scope, #key = :key, #fp = :fp, #status = :in_progress, #token = :token,"
    " #created = :now, #exp = :exp, #lease = :lease, #ttl = :ttl,"
    " #fence = if_not_exists(#fence, :zero) + :one"
    " REMOVE #response, #compressed, #op"
)
RESERVE_NAMES = (
    *("#pk", "#scope", "#key", "#fp", "#status", "#token", "#fence", "#created"),
    *("#exp", "#lease", "#ttl", "#response", "#compressed", "#op"),
)

# Only the current holder may finish: its token AND fence (a stale owner's lease carries an
# older pair once a takeover or re-claim happened), still in progress (a completed record is
# never rewritten, a released one never revived), and not past retention (an expired record
# is absent: finishing it would resurrect it under a reserver that already saw it gone).
HOLDER_CONDITION = (
    "#token = :token AND #fence = :fence AND #status = :in_progress AND #exp > :horizon"
)
# ``extend`` also refuses a lapsed lease: someone else may already be entitled to take it.
EXTEND_CONDITION = HOLDER_CONDITION + " AND #lease > :horizon"

COMPLETE_UPDATE = (
    "SET #status = :completed, #response = :response, #compressed = :compressed,"
    " #exp = :exp, #ttl = :ttl, #op = :op REMOVE #lease"
)
# A tombstone keeps fence and retention: the next acquisition continues the fence.
RELEASE_UPDATE = "SET #status = :released, #op = :op REMOVE #lease"
EXTEND_UPDATE = "SET #lease = :lease, #op = :op"
HOLDER_NAMES = ("#token", "#fence", "#status", "#exp", "#op")

# Sweep deletes only what is still past retention when the delete lands: a key reserved
# again between the scan and the delete is left alone.
SWEEP_FILTER = "#exp <= :horizon"

_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
# DynamoDB numbers stop at 9.99e125; deadlines are clamped to the year 9999.
_MAX_DEADLINE = 253402300799.0
# Bytes an item takes besides the identity strings and the response: attribute names, the
# pk, token, op, numbers (at most 21 bytes each) and the flag, with room to spare.
_ITEM_OVERHEAD = 512
_RESERVE_ATTEMPTS = 5
_SWEEP_CONCURRENCY = 16
_POLL_FIRST = 0.01
_POLL_MAX = 0.5
# A read inside wait gets at least this long even when less of the timeout is left, so that
# wait(timeout=0) still reads once and a read right at the deadline is not cut off (cutting
# one costs the HTTP connection).
_WAIT_READ_FLOOR = 0.1

_UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "LimitExceededException",
    }
)


def _names(*placeholders: str) -> dict[str, str]:
    # DynamoDB rejects unused placeholders, so each request names exactly what it uses.
    return {p: _NAMES[p] for p in placeholders}


def _num(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


def _int(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _text(value: str) -> dict[str, str]:
    return {"S": value}


def _partition_key(scope: str, key: str) -> dict[str, dict[str, str]]:
    digest = hashlib.sha256(scope.encode() + b"\x00" + key.encode()).hexdigest()
    return {"pk": {"S": digest}}


def _utf8_len(text: str) -> int:
    return len(text.encode())


class DynamoDBStore:
    """Records as items of one DynamoDB table, one request per operation.

    Build it with ``open_store("dynamodb://TABLE?region=…")`` or ``DynamoDBStore.from_url``.
    ``session`` (an ``aiobotocore`` session) and ``clock`` (epoch seconds) may be injected.
    """

    __slots__ = (
        "_auto_create",
        "_client",
        "_clock",
        "_closed",
        "_compress_min_bytes",
        "_config",
        "_connect_lock",
        "_endpoint_url",
        "_max_key_length",
        "_profile",
        "_region",
        "_session",
        "_skew",
        "_stack",
        "_table",
        "_url",
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
        max_pool_connections: int = 50,
        max_key_length: int = MAX_KEY_LENGTH,
        session: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise ConfigurationError(
                f"DynamoDB table name {table!r} is invalid: 3 to 255 characters of "
                "A-Z a-z 0-9 _ . -"
            )
        if isinstance(endpoint_url, str) and "@" in endpoint_url.split("?", 1)[0]:
            # botocore logs and reports the endpoint as given, password and all; DynamoDB
            # signs requests with AWS credentials and never reads these.
            raise ConfigurationError(
                "endpoint_url must not carry a user or password (DynamoDB takes credentials "
                f"from the AWS chain): {redact_url(endpoint_url)!r}"
            )
        if not callable(clock):
            raise ConfigurationError(
                f"clock must be a callable returning epoch seconds, not {clock!r}"
            )
        if not math.isfinite(clock_skew) or clock_skew < 0:
            raise ConfigurationError(f"clock_skew must be >= 0 seconds, not {clock_skew!r}")
        if compress_min_bytes < 0:
            raise ConfigurationError(f"compress_min_bytes must be >= 0, not {compress_min_bytes!r}")
        if max_attempts < 1 or max_pool_connections < 1:
            raise ConfigurationError("max_attempts and max_pool_connections must be at least 1")
        for name, seconds in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            check_duration(name, seconds)
        self._table = table
        self._region = region
        self._endpoint_url = endpoint_url
        self._profile = profile
        self._auto_create = auto_create
        self._skew = float(clock_skew)
        self._compress_min_bytes = compress_min_bytes
        self._config = {
            # "standard" retries throttling and transient errors with backoff; past
            # max_attempts the error surfaces as StoreUnavailableError.
            "retries": {"max_attempts": max_attempts, "mode": "standard"},
            "connect_timeout": float(connect_timeout),
            "read_timeout": float(read_timeout),
            "max_pool_connections": max_pool_connections,
        }
        self._max_key_length = max_key_length
        self._session = session
        self._clock = clock
        self._url = f"dynamodb://{table}"
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``dynamodb://TABLE``; options: region, endpoint_url, profile, auto_create,
        clock_skew, compress_min_bytes, max_attempts, connect_timeout, read_timeout,
        max_pool_connections, max_key_length (and ``session``, ``clock`` as keywords)."""
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
        opts = parsed.options
        store = cls(
            parsed.netloc,
            region=_pop_optional_str(opts, "region"),
            endpoint_url=_pop_optional_str(opts, "endpoint_url"),
            profile=_pop_optional_str(opts, "profile"),
            auto_create=pop_bool(opts, "auto_create", False),
            clock_skew=pop_float(opts, "clock_skew", 0.1),
            compress_min_bytes=pop_int(opts, "compress_min_bytes", 1024),
            max_attempts=pop_int(opts, "max_attempts", 3),
            connect_timeout=pop_float(opts, "connect_timeout", 2.0),
            read_timeout=pop_float(opts, "read_timeout", 5.0),
            max_pool_connections=pop_int(opts, "max_pool_connections", 50),
            max_key_length=pop_int(opts, "max_key_length", MAX_KEY_LENGTH),
            session=opts.pop("session", None),
            clock=opts.pop("clock", time.time),
        )
        parsed.reject_unknown()
        return store

    # -- connection --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this DynamoDBStore is closed")

    async def _connect(self) -> Any:
        self._check_open()
        if self._client is not None:
            return self._client
        async with self._connect_lock:
            self._check_open()
            if self._client is not None:
                return self._client
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
            except Exception as exc:
                await stack.aclose()
                raise self._error(exc) from exc
            if self._auto_create:
                try:
                    await self._create_table(client)
                except BaseException:
                    await stack.aclose()
                    raise
            if self._closed:
                # close() ran while the client was being built: it would outlive the store.
                with contextlib.suppress(Exception):
                    await stack.aclose()
                self._check_open()
            self._stack = stack
            self._client = client
        return client

    async def _call(self, operation: str, **request: Any) -> dict[str, Any]:
        """One request; every driver error mapped (``ConditionalCheckFailedException`` is
        left to the caller, which needs its ``Item``)."""
        client = await self._connect()
        try:
            response: dict[str, Any] = await getattr(client, operation)(
                TableName=self._table, **request
            )
        except Exception as exc:
            if _error_code(exc) == "ConditionalCheckFailedException":
                raise
            raise self._error(exc) from exc
        return response

    def _error(self, exc: BaseException) -> IdemstoreError:
        """The idemstore error for a driver exception (the one mapping function)."""
        from botocore.exceptions import NoCredentialsError, NoRegionError

        where = f"DynamoDB table {self._table!r}"
        if self._endpoint_url:
            where += f" at {redact_url(self._endpoint_url)}"
        code = _error_code(exc)
        message = _error_message(exc)
        if isinstance(exc, IdemstoreError):
            return exc
        if isinstance(exc, NoRegionError):
            return ConfigurationError(
                "no AWS region for the DynamoDB store: add ?region=... to the URL or set "
                "AWS_DEFAULT_REGION"
            )
        if isinstance(exc, NoCredentialsError):
            return StoreUnavailableError(
                f"no AWS credentials found for {where}: configure the usual AWS chain "
                "(environment, ~/.aws, instance or task role)"
            )
        if code == "ResourceNotFoundException":
            return SchemaError(
                f"{where} does not exist: run `idemstore migrate {self._url}?region=...` "
                "(or open the store with ?auto_create=true)"
            )
        if code == "ValidationException" and "key element does not match" in message:
            return SchemaError(
                f"{where} does not have idemstore's key schema (partition key 'pk', a string): "
                f"check `idemstore migrate {self._url} --status`"
            )
        if code == "ValidationException" and "size" in message.lower():
            return ResponseTooLargeError(f"the item exceeds DynamoDB's 400 KB limit: {message}")
        if code in ("AccessDeniedException", "UnrecognizedClientException"):
            return StoreUnavailableError(
                f"{where} refused the request ({code}): check the credentials and the IAM "
                f"permissions listed in docs/backends/dynamodb.md. {message}"
            )
        if code in _UNAVAILABLE_CODES:
            return StoreUnavailableError(
                f"{where} is throttling or failing ({code}) after the SDK's retries: {message}"
            )
        if code is not None:
            return StoreUnavailableError(f"{where} answered {code}: {message}")
        return StoreUnavailableError(f"{where} could not be reached: {exc!r}")

    # -- encoding ----------------------------------------------------------------------------

    def _horizon(self, now: float) -> dict[str, str]:
        return _num(now - self._skew)

    def _ttl(self, expires_at: float) -> dict[str, str]:
        return _int(math.ceil(expires_at + self._skew))

    def _live(self, item: Mapping[str, Any] | None, now: float) -> bool:
        return (
            item is not None
            and "status" in item
            and item["status"]["S"] != "released"
            and float(item["expires_at"]["N"]) > now - self._skew
        )

    @staticmethod
    def _record(item: Mapping[str, Any]) -> Record:
        status = Status(item["status"]["S"])
        response: bytes | None = None
        if status is Status.COMPLETED and "response" in item:
            response = bytes(item["response"]["B"])
            if item.get("compressed", {}).get("BOOL", False):
                response = zlib.decompress(response)
        elif status is Status.COMPLETED:
            response = b""
        lease = item.get("lease_expires_at")
        return Record(
            scope=item["scope"]["S"],
            key=item["key"]["S"],
            fingerprint=item["fingerprint"]["S"],
            status=status,
            token=item["token"]["S"],
            fence=int(item["fence"]["N"]),
            response=response,
            created_at=float(item["created_at"]["N"]),
            expires_at=float(item["expires_at"]["N"]),
            lease_expires_at=(
                float(lease["N"]) if status is Status.IN_PROGRESS and lease is not None else None
            ),
        )

    def _encode_response(self, response: bytes) -> tuple[bytes, bool]:
        if len(response) >= self._compress_min_bytes and response:
            packed = zlib.compress(response, 6)
            if len(packed) < len(response):
                return packed, True
        return response, False

    # -- the contract ------------------------------------------------------------------------

    async def reserve(
        self,
        key: str,
        fingerprint: str,
        *,
        scope: str = "",
        lease_ttl: float,
        retention: float,
    ) -> Reservation:
        check_identity(key, scope, fingerprint, max_key_length=self._max_key_length)
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        retention = check_duration("retention", retention)
        for _ in range(_RESERVE_ATTEMPTS):
            outcome = await self._try_reserve(key, fingerprint, scope, lease_ttl, retention)
            if outcome is not None:
                return outcome
        raise StoreUnavailableError(
            f"reserve of {key!r} kept failing its condition without a readable record "
            f"({_RESERVE_ATTEMPTS} attempts): the item is being rewritten concurrently"
        )

    async def _try_reserve(
        self, key: str, fingerprint: str, scope: str, lease_ttl: float, retention: float
    ) -> Reservation | None:
        now = self._clock()
        token = new_token()
        expires_at = min(now + retention, _MAX_DEADLINE)
        lease_expires_at = min(now + lease_ttl, _MAX_DEADLINE)
        try:
            response = await self._call(
                "update_item",
                Key=_partition_key(scope, key),
                UpdateExpression=RESERVE_UPDATE,
                ConditionExpression=RESERVE_CONDITION,
                ExpressionAttributeNames=_names(*RESERVE_NAMES),
                ExpressionAttributeValues={
                    ":scope": _text(scope),
                    ":key": _text(key),
                    ":fp": _text(fingerprint),
                    ":in_progress": _text(Status.IN_PROGRESS.value),
                    ":released": _text("released"),
                    ":token": _text(token),
                    ":now": _num(now),
                    ":exp": _num(expires_at),
                    ":lease": _num(lease_expires_at),
                    ":ttl": self._ttl(expires_at),
                    ":horizon": self._horizon(now),
                    ":zero": _int(0),
                    ":one": _int(1),
                },
                # The old item tells us the fence we just raised and whether it was a takeover.
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            existing = await self._failed_item(exc, scope, key)
            if existing is None:
                return None  # gone between the write and the read: try again
            if existing.get("token", {}).get("S") == token:
                # The SDK retried a write that had landed: the key is ours.
                record = self._record(existing)
                assert record.lease_expires_at is not None
                lease = Lease(scope, key, token, record.fence, record.lease_expires_at, retention)
                return Reservation(Outcome.ACQUIRED, lease=lease)
            if not self._live(existing, now):
                return None  # became reservable after our condition was evaluated
            record = self._record(existing)
            if record.fingerprint != fingerprint:
                return Reservation(Outcome.MISMATCH, record=record)
            if record.status is Status.COMPLETED:
                return Reservation(Outcome.COMPLETED, record=record)
            return Reservation(Outcome.IN_PROGRESS, record=record)
        old = response.get("Attributes")
        fence = int(old["fence"]["N"]) + 1 if old and "fence" in old else 1
        takeover = bool(
            old and self._live(old, now) and old["status"]["S"] == Status.IN_PROGRESS.value
        )
        lease = Lease(scope, key, token, fence, lease_expires_at, retention)
        return Reservation(Outcome.ACQUIRED, lease=lease, takeover=takeover)

    async def _failed_item(self, exc: Exception, scope: str, key: str) -> Mapping[str, Any] | None:
        """The item a conditional write failed on (``ALL_OLD``); re-raise anything else.

        Endpoints that ignore ``ReturnValuesOnConditionCheckFailure`` (older DynamoDB Local)
        get one consistent ``GetItem`` instead.
        """
        if _error_code(exc) != "ConditionalCheckFailedException":
            raise exc
        item: Mapping[str, Any] | None = getattr(exc, "response", {}).get("Item")
        if item is None:
            read = await self._call("get_item", Key=_partition_key(scope, key), ConsistentRead=True)
            item = read.get("Item")
        return item

    async def _holder_write(
        self,
        lease: Lease,
        update: str,
        condition: str,
        names: tuple[str, ...],
        values: dict[str, Any],
        now: float,
    ) -> bool:
        """A write only the lease holder may make; ``False`` when fenced out."""
        op = new_token()
        try:
            await self._call(
                "update_item",
                Key=_partition_key(lease.scope, lease.key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=_names(*names),
                ExpressionAttributeValues={
                    ":token": _text(lease.token),
                    ":fence": _int(lease.fence),
                    ":in_progress": _text(Status.IN_PROGRESS.value),
                    ":horizon": self._horizon(now),
                    ":op": _text(op),
                    **values,
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            if _error_code(exc) != "ConditionalCheckFailedException":
                raise
            return _confirmed_retry(exc, op)
        return True

    async def complete(
        self, lease: Lease, response: bytes, *, retention: float | None = None
    ) -> bool:
        response = check_response(response)
        keep = check_duration("retention", retention if retention is not None else lease.retention)
        stored, compressed = self._encode_response(response)
        size = (
            _ITEM_OVERHEAD
            + _utf8_len(lease.scope)
            + _utf8_len(lease.key)
            + 4 * MAX_FINGERPRINT_LENGTH
            + len(stored)
        )
        if size > ITEM_LIMIT:
            # Refused before any I/O: the record stays in progress and the lease can still
            # be released (or completed with a smaller response).
            raise ResponseTooLargeError(
                f"the response is {len(response)} bytes ({len(stored)} stored"
                f"{' after zlib' if compressed else ''}); with the record it would exceed "
                f"DynamoDB's 400 KB item limit. Store large results elsewhere and record a "
                "reference, or release the lease"
            )
        now = self._clock()
        expires_at = min(now + keep, _MAX_DEADLINE)
        return await self._holder_write(
            lease,
            COMPLETE_UPDATE,
            HOLDER_CONDITION,
            (*HOLDER_NAMES, "#response", "#compressed", "#ttl", "#lease"),
            {
                ":completed": _text(Status.COMPLETED.value),
                ":response": {"B": stored},
                ":compressed": {"BOOL": compressed},
                ":exp": _num(expires_at),
                ":ttl": self._ttl(expires_at),
            },
            now,
        )

    async def release(self, lease: Lease) -> bool:
        return await self._holder_write(
            lease,
            RELEASE_UPDATE,
            HOLDER_CONDITION,
            (*HOLDER_NAMES, "#lease"),
            {":released": _text("released")},
            self._clock(),
        )

    async def extend(self, lease: Lease, *, lease_ttl: float) -> Lease | None:
        lease_ttl = check_duration("lease_ttl", lease_ttl)
        now = self._clock()
        deadline = min(now + lease_ttl, _MAX_DEADLINE)
        extended = await self._holder_write(
            lease,
            EXTEND_UPDATE,
            EXTEND_CONDITION,
            (*HOLDER_NAMES, "#lease"),
            {":lease": _num(deadline)},
            now,
        )
        if not extended:
            return None
        return Lease(lease.scope, lease.key, lease.token, lease.fence, deadline, lease.retention)

    async def get(self, key: str, *, scope: str = "") -> Record | None:
        check_identity(key, scope, max_key_length=self._max_key_length)
        response = await self._call("get_item", Key=_partition_key(scope, key), ConsistentRead=True)
        item = response.get("Item")
        if item is None or not self._live(item, self._clock()):
            return None
        return self._record(item)

    async def _get_by(self, key: str, scope: str, deadline: float) -> Record | None:
        """``get`` given until ``deadline`` (at least ``_WAIT_READ_FLOOR``): ``TimeoutError``
        when it did not finish by then."""
        floor = asyncio.get_running_loop().time() + _WAIT_READ_FLOOR
        async with asyncio.timeout_at(max(deadline, floor)):
            return await self.get(key, scope=scope)

    async def wait(self, key: str, *, scope: str = "", timeout: float) -> Record | None:
        """Every read is bounded by the time left (the SDK's timeouts and retries could
        otherwise hold one far past ``timeout``). When the first read cannot finish in time,
        nothing is known: ``StoreUnavailableError``. When a later one cannot, the record it
        was meant to refresh is returned, the last one the table answered."""
        check_identity(key, scope, max_key_length=self._max_key_length)
        timeout = check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = _POLL_FIRST
        try:
            record = await self._get_by(key, scope, deadline)
        except TimeoutError as exc:
            raise StoreUnavailableError(
                f"DynamoDB table {self._table!r} did not answer within the wait's timeout"
            ) from exc
        while True:
            if record is None or record.status is Status.COMPLETED:
                return record
            assert record.lease_expires_at is not None
            # The lease counts as lapsed once the skew margin has passed too (as for takeover).
            until_lapse = record.lease_expires_at + self._skew - self._clock()
            remaining = deadline - loop.time()
            if until_lapse <= 0 or remaining <= 0:
                return record
            # No push channel in DynamoDB: poll with capped exponential backoff.
            await asyncio.sleep(max(0.0, min(delay, remaining, until_lapse)))
            delay = min(delay * 2, _POLL_MAX)
            try:
                record = await self._get_by(key, scope, deadline)
            except TimeoutError:
                return record

    async def delete(self, key: str, *, scope: str = "") -> bool:
        check_identity(key, scope, max_key_length=self._max_key_length)
        response = await self._call(
            "delete_item", Key=_partition_key(scope, key), ReturnValues="ALL_OLD"
        )
        return self._live(response.get("Attributes"), self._clock())

    async def stats(self, *, limit: int = DEFAULT_LIMIT) -> StoreStats:
        """One ``Scan`` of at most ``limit`` items, projected to four attributes and classified
        here. A Scan is billed for every item it reads, whole (0.5 read unit per 4 KB, eventually
        consistent), projection or filter notwithstanding; one projected Scan is cheaper than
        one ``Select=COUNT`` Scan per state, each of which would read the table again."""
        limit = check_limit(limit)
        # Deadlines count as passed by the same margin every read applies (clock_skew).
        tally = StatsTally(self._clock() - self._skew)
        names = _names("#status", "#created", "#exp", "#lease")
        start: dict[str, Any] | None = None
        complete = False
        while tally.scanned < limit:
            page = await self._call(
                "scan",
                ProjectionExpression="#status, #created, #exp, #lease",
                ExpressionAttributeNames=names,
                Limit=min(1000, limit - tally.scanned),
                **({"ExclusiveStartKey": start} if start else {}),
            )
            for item in page.get("Items", []):
                lease = item.get("lease_expires_at")
                tally.add(
                    item["status"]["S"],
                    float(item["created_at"]["N"]),
                    float(item["expires_at"]["N"]),
                    None if lease is None else float(lease["N"]),
                )
            start = page.get("LastEvaluatedKey")
            if not start:
                complete = True
                break
        method = "one Scan of the table, projected (billed for every item read, whole)"
        return tally.result(complete=complete, method=method)

    async def sweep(self, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` items past retention, found by a ``Scan`` of the table.

        With DynamoDB TTL enabled this is never needed (reads already hide expired items):
        it costs a read of the whole table. Each delete is conditioned on the item still
        being expired.
        """
        limit = check_limit(limit)
        now = self._clock()
        names = _names("#pk", "#exp")
        horizon = self._horizon(now)
        found: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while len(found) < limit:
            page = await self._call(
                "scan",
                FilterExpression=SWEEP_FILTER,
                ProjectionExpression="#pk",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={":horizon": horizon},
                **({"ExclusiveStartKey": start} if start else {}),
            )
            found.extend(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        gate = asyncio.Semaphore(_SWEEP_CONCURRENCY)

        async def remove(item: dict[str, Any]) -> bool:
            async with gate:
                try:
                    await self._call(
                        "delete_item",
                        Key={"pk": item["pk"]},
                        ConditionExpression=SWEEP_FILTER,
                        ExpressionAttributeNames=_names("#exp"),
                        ExpressionAttributeValues={":horizon": horizon},
                    )
                except Exception as exc:
                    if _error_code(exc) == "ConditionalCheckFailedException":
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

    async def ping(self) -> None:
        # A data-plane read of an item that never exists: proves endpoint, credentials and
        # table (DescribeTable has a far lower rate limit).
        await self._call(
            "get_item",
            Key={"pk": {"S": "idemstore-ping"}},
            ProjectionExpression="#pk",
            ExpressionAttributeNames=_names("#pk"),
        )

    async def close(self) -> None:
        self._closed = True
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def __aenter__(self) -> Self:
        # Fail at startup, not on the first request, when the endpoint, the credentials or
        # the table are wrong (``__aexit__`` will not run then: close here).
        try:
            await self._connect()
            await self.ping()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the table (for `idemstore migrate`) ------------------------------------------------

    def table_definition(self) -> dict[str, Any]:
        """The table as JSON: the ``CreateTable`` request plus ``TimeToLiveSpecification``,
        which is also the shape of a CloudFormation ``AWS::DynamoDB::Table``'s Properties."""
        return {
            "TableName": self._table,
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
        }

    async def table_status(self) -> dict[str, Any]:
        """``{"table", "exists", "status", "key_schema_ok", "ttl_enabled", "ttl_attribute",
        "billing_mode"}``; a missing table gives ``exists: False`` (and no error)."""
        return await self._table_status(await self._connect())

    async def _table_status(self, client: Any) -> dict[str, Any]:
        status: dict[str, Any] = {
            "table": self._table,
            "exists": False,
            "status": None,
            "key_schema_ok": False,
            "ttl_enabled": False,
            "ttl_attribute": None,
            "billing_mode": None,
        }
        try:
            described = (await client.describe_table(TableName=self._table))["Table"]
        except Exception as exc:
            if _error_code(exc) == "ResourceNotFoundException":
                return status
            raise self._error(exc) from exc
        status.update(
            exists=True,
            status=described.get("TableStatus"),
            key_schema_ok=_key_schema_ok(described),
            billing_mode=described.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED"),
        )
        try:
            ttl = (await client.describe_time_to_live(TableName=self._table))[
                "TimeToLiveDescription"
            ]
        except Exception as exc:
            raise self._error(exc) from exc
        status["ttl_enabled"] = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        status["ttl_attribute"] = ttl.get("AttributeName")
        return status

    async def create_table(self) -> bool:
        """Create the table (on-demand billing), wait until it is active, enable TTL.

        Returns ``False`` when the table already existed with the right key schema and TTL
        (nothing to do), ``True`` when it created the table or enabled TTL. A table of that
        name with another key schema raises ``SchemaError``.
        """
        return await self._create_table(await self._connect())

    async def _create_table(self, client: Any) -> bool:
        current = await self._table_status(client)
        changed = False
        if not current["exists"]:
            request = self.table_definition()
            request.pop("TimeToLiveSpecification")
            try:
                await client.create_table(**request)
            except Exception as exc:
                # Another migrator may have created it a moment ago: that is fine.
                if _error_code(exc) != "ResourceInUseException":
                    raise self._error(exc) from exc
            changed = True
        elif not current["key_schema_ok"]:
            raise SchemaError(
                f"DynamoDB table {self._table!r} exists with another key schema; idemstore "
                "needs a partition key 'pk' of type S and no sort key. Use another table name"
            )
        await self._wait_active(client)
        current = await self._table_status(client)
        if not current["ttl_enabled"]:
            try:
                await client.update_time_to_live(
                    TableName=self._table,
                    TimeToLiveSpecification={"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
                )
            except Exception as exc:
                raise self._error(exc) from exc
            changed = True
        elif current["ttl_attribute"] != TTL_ATTRIBUTE:
            raise SchemaError(
                f"DynamoDB table {self._table!r} has TTL on {current['ttl_attribute']!r}; "
                f"idemstore writes its expiry to {TTL_ATTRIBUTE!r}. Disable TTL on the table "
                f"and run `idemstore migrate {self._url}` again"
            )
        return changed

    async def _wait_active(self, client: Any, timeout: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                described = (await client.describe_table(TableName=self._table))["Table"]
            except Exception as exc:
                if _error_code(exc) != "ResourceNotFoundException":
                    raise self._error(exc) from exc
                described = {}
            if described.get("TableStatus") == "ACTIVE":
                return
            if loop.time() >= deadline:
                raise StoreUnavailableError(
                    f"DynamoDB table {self._table!r} did not become ACTIVE within {timeout:.0f}s"
                )
            await asyncio.sleep(1.0)


def _key_schema_ok(described: Mapping[str, Any]) -> bool:
    types = {a["AttributeName"]: a["AttributeType"] for a in described["AttributeDefinitions"]}
    return (
        described.get("KeySchema") == [{"AttributeName": "pk", "KeyType": "HASH"}]
        and types.get("pk") == "S"
    )


def _confirmed_retry(exc: BaseException, op: str) -> bool:
    """Whether a failed holder write had in fact landed: the SDK retried it (say, after a
    timeout) and the retry found the nonce of its own first attempt."""
    item = getattr(exc, "response", {}).get("Item") or {}
    return bool(item.get("op", {}).get("S") == op)


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def _error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", ""))
    return str(exc)


def _pop_optional_str(options: dict[str, Any], name: str) -> str | None:
    value = options.pop(name, None)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"option {name} must be a string, not {value!r}")
    return value
