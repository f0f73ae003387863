"""Bad input on every backend: only the documented errors, exact round trips, no cross-talk.

Hypothesis feeds keys, scopes, fingerprints, responses and argument values of every shape
(huge, empty, NUL, lone surrogates, SQL / Lua / glob / hash-tag metacharacters, non-str types)
to each real engine. An input either fails with the documented error *before* touching the
record, or it round-trips exactly. ``pytest --hypothesis-show-statistics`` prints how many
inputs each backend was given (the ``event`` lines say how many were valid).
"""

from __future__ import annotations

import math
import random
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from idemstore import (
    ConfigurationError,
    InvalidKeyError,
    Outcome,
    ResponseTooLargeError,
    Status,
)
from idemstore.backends.registry import known_schemes
from idemstore.records import (
    MAX_DURATION,
    MAX_FINGERPRINT_LENGTH,
    MAX_KEY_LENGTH,
    MAX_SCOPE_LENGTH,
)
from tests.reliability.hypothesis_settings import OVER_ONE_FIXTURE

if TYPE_CHECKING:
    from idemstore import IdempotencyStore

pytestmark = pytest.mark.slow

# ``store`` is the contract suite's fixture (idemstore.testing): a fresh store of every fixture
# variant in the registry, so every backend runs these tests, from one list.

LONG = 600.0
# Per backend and test. Every example is a few round trips on a real engine.
STORE_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# Strings that mean something to some engine or to our own key encodings.
METACHARACTERS = [
    "'; DROP TABLE idemstore_records; --",
    "' OR '1'='1",
    '"; DROP TABLE x; --',
    "]]",
    "]]..redis.call('FLUSHALL')..[[",
    "%",
    "%%",
    "%25",
    "%3A",
    "%7B",
    "{}",
    "{",
    "}",
    "}{",
    "{a}:{b}",
    ":",
    "::",
    "*",
    "?",
    "[a-z]",
    "\\",
    "\\x00",
    "$1",
    "%s",
    ":now",
    "@p",
    "#pk",
    "\n",
    "\r\n",
    "\t",
    "\x01",
    "\x7f",
    "\u2028",
    "\ufeff",
    "\uffff",
    "\U0001f600",
    "e\u0301",
    "é",
    "idem:",
    "released",
    "in_progress",
]

_text = st.text(max_size=12)
_metachar = st.sampled_from(METACHARACTERS)
_mixed = st.lists(st.one_of(_metachar, _text), min_size=1, max_size=4).map("".join)
_lone_surrogate = st.integers(0xD800, 0xDFFF).map(chr)
_with_surrogate = st.tuples(_mixed, _lone_surrogate, _text).map("".join)
_with_nul = st.tuples(_text, _text).map(lambda parts: parts[0] + "\x00" + parts[1])
_too_long = st.sampled_from([MAX_SCOPE_LENGTH + 1, 100_000]).map(lambda n: "k" * n)
_non_str = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.lists(st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=1),
    st.builds(bytearray, st.binary(max_size=4)),
)
_invalid_text = st.one_of(_with_surrogate, _with_nul, _too_long, st.just(""), _non_str, _non_str)


def _part(limit: int) -> st.SearchStrategy[Any]:
    """Mostly valid for a part of at most ``limit`` characters (so that about half the
    identities reach the engine), sometimes not: exactly at the limit, one past it, empty,
    NUL, lone surrogates, not a str."""
    at_limit = st.sampled_from(
        ["k" * limit, "\U0001f600" * limit, "é" * limit, "%{" * (limit // 2), "k" * (limit + 1)]
    )
    valid = st.one_of(st.text(min_size=1, max_size=12), _mixed, _mixed, at_limit).filter(
        lambda s: "\x00" not in s and 0 < len(s) <= limit
    )
    return st.one_of(valid, valid, valid, valid, valid, valid, at_limit, _invalid_text)


def valid_text(value: object, max_length: int, *, allow_empty: bool) -> bool:
    """The documented rule (SEMANTICS.md section 1), written independently of records.py."""
    if not isinstance(value, str) or len(value) > max_length or "\x00" in value:
        return False
    if not value and not allow_empty:
        return False
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def backend_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["idemstore_contract_target"].id)


async def fresh_lease(store: IdempotencyStore, *, scope: str = "") -> Any:
    reservation = await store.reserve(
        f"k-{uuid.uuid4().hex}", "fp", scope=scope, lease_ttl=LONG, retention=LONG
    )
    assert reservation.lease is not None
    return reservation.lease


# -- keys, scopes, fingerprints ------------------------------------------------------------


@settings(STORE_SETTINGS, max_examples=60)
@given(key=_part(MAX_KEY_LENGTH), scope=_part(MAX_SCOPE_LENGTH), fp=_part(MAX_FINGERPRINT_LENGTH))
@example(key="'; DROP TABLE idemstore_records; --", scope="]]", fp="%")
@example(key="k" * MAX_KEY_LENGTH, scope="s" * MAX_SCOPE_LENGTH, fp="f" * MAX_FINGERPRINT_LENGTH)
@example(key="\U0001f600" * MAX_KEY_LENGTH, scope="{}" * 512, fp="é" * MAX_FINGERPRINT_LENGTH)
@example(key="a\x00b", scope="", fp="fp")
@example(key="a\ud800", scope="", fp="fp")
@example(key="k", scope="s\udfff", fp="fp")
@example(key="k", scope="", fp="")
@example(key="", scope="", fp="fp")
@example(key=b"k", scope="", fp="fp")
@example(key="k", scope=None, fp="fp")
@example(key="k", scope="", fp=7)
async def test_identity_of_any_shape_is_refused_or_round_trips(
    store: IdempotencyStore, key: Any, scope: Any, fp: Any
) -> None:
    valid = (
        valid_text(key, MAX_KEY_LENGTH, allow_empty=False)
        and valid_text(scope, MAX_SCOPE_LENGTH, allow_empty=True)
        and valid_text(fp, MAX_FINGERPRINT_LENGTH, allow_empty=False)
    )
    event(f"identity {'valid' if valid else 'invalid'}")
    if not valid:
        with pytest.raises(InvalidKeyError):
            await store.reserve(key, fp, scope=scope, lease_ttl=LONG, retention=LONG)
        if not (
            valid_text(key, MAX_KEY_LENGTH, allow_empty=False)
            and valid_text(scope, MAX_SCOPE_LENGTH, allow_empty=True)
        ):
            for read in (store.get(key, scope=scope), store.delete(key, scope=scope)):
                with pytest.raises(InvalidKeyError):
                    await read
            with pytest.raises(InvalidKeyError):
                await store.wait(key, scope=scope, timeout=0)
        return
    # Hypothesis may repeat an identity: start from nothing.
    await store.delete(key, scope=scope)
    assert await store.get(key, scope=scope) is None
    reservation = await store.reserve(key, fp, scope=scope, lease_ttl=LONG, retention=LONG)
    assert reservation.outcome is Outcome.ACQUIRED
    lease = reservation.lease
    assert lease is not None
    assert (lease.scope, lease.key) == (scope, key)
    record = await store.get(key, scope=scope)
    assert record is not None
    assert (record.scope, record.key, record.fingerprint) == (scope, key, fp)
    assert record.status is Status.IN_PROGRESS
    response = (key + "|" + scope + "|" + fp).encode() + b"\x00\xff"
    assert await store.complete(lease, response) is True
    replay = await store.reserve(key, fp, scope=scope, lease_ttl=LONG, retention=LONG)
    assert replay.outcome is Outcome.COMPLETED
    assert replay.record is not None
    assert (replay.record.scope, replay.record.key) == (scope, key)
    assert replay.record.response == response
    waited = await store.wait(key, scope=scope, timeout=0)
    assert waited is not None and waited.response == response
    assert await store.delete(key, scope=scope) is True
    assert await store.get(key, scope=scope) is None


# Pairs whose naive concatenations collide, to catch an encoding that is not injective.
COLLIDING_PAIRS = [
    (("a:b", "c"), ("a", "b:c")),
    (("a%3Ab", "c"), ("a:b", "c")),
    (("", "a:b"), ("a", "b")),
    (("{a", "b}"), ("a", "b")),
    (("a\u00e9", "b"), ("ae\u0301", "b")),
    (("x", "y"), ("x", "Y")),
    (("s", "k"), ("s ", "k")),
    (("%", "%"), ("%25", "%25")),
    (("a", ""), ("", "a")),
]

_identity_part = st.one_of(_text, _mixed).filter(
    lambda s: valid_text(s, MAX_SCOPE_LENGTH, allow_empty=True)
)


@STORE_SETTINGS
@given(
    first=st.tuples(_identity_part, _identity_part),
    second=st.tuples(_identity_part, _identity_part),
)
@example(first=COLLIDING_PAIRS[0][0], second=COLLIDING_PAIRS[0][1])
@example(first=COLLIDING_PAIRS[1][0], second=COLLIDING_PAIRS[1][1])
@example(first=COLLIDING_PAIRS[3][0], second=COLLIDING_PAIRS[3][1])
@example(first=COLLIDING_PAIRS[4][0], second=COLLIDING_PAIRS[4][1])
@example(first=COLLIDING_PAIRS[7][0], second=COLLIDING_PAIRS[7][1])
async def test_a_record_is_never_visible_under_another_scope_or_key(
    store: IdempotencyStore, first: tuple[str, str], second: tuple[str, str]
) -> None:
    # A fresh suffix on both keys keeps whatever collision the pair was built for.
    nonce = uuid.uuid4().hex[:12]
    (scope_a, key_a), (scope_b, key_b) = (
        (first[0], first[1] + nonce),
        (second[0], second[1] + nonce),
    )
    if (scope_a, key_a) == (scope_b, key_b) or len(key_a) > MAX_KEY_LENGTH:
        event("pair skipped (same identity)")
        return
    if len(key_b) > MAX_KEY_LENGTH:
        return
    a = await store.reserve(key_a, "fp-a", scope=scope_a, lease_ttl=LONG, retention=LONG)
    assert a.outcome is Outcome.ACQUIRED and a.lease is not None
    assert await store.get(key_b, scope=scope_b) is None
    assert await store.complete(a.lease, b"response-a") is True
    assert await store.get(key_b, scope=scope_b) is None
    assert await store.wait(key_b, scope=scope_b, timeout=0) is None
    b = await store.reserve(key_b, "fp-b", scope=scope_b, lease_ttl=LONG, retention=LONG)
    assert b.outcome is Outcome.ACQUIRED and b.lease is not None
    assert b.lease.fence == 1
    assert await store.complete(b.lease, b"response-b") is True
    got_a = await store.get(key_a, scope=scope_a)
    got_b = await store.get(key_b, scope=scope_b)
    assert got_a is not None and got_b is not None
    assert (got_a.scope, got_a.key, got_a.fingerprint, got_a.response) == (
        scope_a,
        key_a,
        "fp-a",
        b"response-a",
    )
    assert (got_b.scope, got_b.key, got_b.fingerprint, got_b.response) == (
        scope_b,
        key_b,
        "fp-b",
        b"response-b",
    )
    # Deleting one leaves the other.
    assert await store.delete(key_a, scope=scope_a) is True
    assert await store.get(key_b, scope=scope_b) is not None


# -- responses -----------------------------------------------------------------------------


def _random_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


response_value = st.one_of(
    st.binary(max_size=2048),
    st.just(b""),
    st.just(b"\x00" * 64),
    st.sampled_from([b"]]", b"'; DROP TABLE x; --", b"%{}", b"\xff\xfe\xfd", b"\r\n\x00"]),
    st.builds(_random_bytes, st.integers(0, 2**32), st.sampled_from([70_000, 300_000, 500_000])),
    st.sampled_from([1, 8_000_000]).map(lambda n: b"a" * n),
    st.builds(bytearray, st.binary(max_size=64)),
    st.builds(memoryview, st.binary(max_size=64)),
    st.text(max_size=8),
    st.none(),
    st.integers(),
    st.lists(st.integers(0, 255), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


@STORE_SETTINGS
@given(response=response_value)
@example(response=b"")
@example(response="text is not bytes")
@example(response=_random_bytes(1, 500_000))
@example(response=b"a" * 8_000_000)
async def test_a_response_of_any_shape_is_refused_or_round_trips(
    store: IdempotencyStore, request: pytest.FixtureRequest, response: Any
) -> None:
    backend = backend_of(request)
    key = f"k-{uuid.uuid4().hex}"
    reservation = await store.reserve(key, "fp", lease_ttl=LONG, retention=LONG)
    lease = reservation.lease
    assert lease is not None
    if not isinstance(response, bytes | bytearray | memoryview):
        event("response not bytes")
        with pytest.raises(TypeError):
            await store.complete(lease, response)
    else:
        expected = bytes(response)
        try:
            completed = await store.complete(lease, response)
        except ResponseTooLargeError:
            # Only DynamoDB has an item limit (400 KB, after compression).
            event("response too large")
            assert backend == "dynamodb", f"{backend} refused {len(expected)} bytes"
            assert len(expected) > 300_000
        else:
            event("response stored")
            assert completed is True
            record = await store.get(key)
            assert record is not None
            assert record.status is Status.COMPLETED
            assert record.response == expected
            return
    # Refused before any write: the record is untouched and the holder can still finish.
    record = await store.get(key)
    assert record is not None
    assert record.status is Status.IN_PROGRESS and record.response is None
    assert await store.complete(lease, b"small") is True
    record = await store.get(key)
    assert record is not None and record.response == b"small"


# -- durations, timeouts, limits -----------------------------------------------------------

duration_value = st.one_of(
    st.floats(),
    st.floats(min_value=1e-300, max_value=1e-3),
    st.floats(min_value=10, max_value=1e300),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, -0.0, 1e-320, 10**400, -(10**400), 2**63, 1e308]),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.sampled_from(["60", b"60", [60], {"s": 60}]),
)


def valid_duration(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        as_float = float(value)
    except OverflowError:
        return False
    return math.isfinite(as_float) and 0 < as_float <= MAX_DURATION


@STORE_SETTINGS
@given(lease_ttl=duration_value, retention=duration_value)
@example(lease_ttl=1e300, retention=1e300)
@example(lease_ttl=10**400, retention=60)
@example(lease_ttl=60, retention=math.nan)
@example(lease_ttl=60, retention=2**63)
async def test_durations_of_any_shape_are_refused_or_honoured(
    store: IdempotencyStore, lease_ttl: Any, retention: Any
) -> None:
    key = f"k-{uuid.uuid4().hex}"
    valid = valid_duration(lease_ttl) and valid_duration(retention)
    event(f"durations {'valid' if valid else 'invalid'}")
    if not valid:
        with pytest.raises(ConfigurationError):
            await store.reserve(key, "fp", lease_ttl=lease_ttl, retention=retention)
        assert await store.get(key) is None
        lease = await fresh_lease(store)
        if not valid_duration(lease_ttl):
            with pytest.raises(ConfigurationError):
                await store.extend(lease, lease_ttl=lease_ttl)
        if retention is not None and not valid_duration(retention):
            # (complete's retention=None means "the one given to reserve")
            with pytest.raises(ConfigurationError):
                await store.complete(lease, b"x", retention=retention)
        # None of that touched the lease.
        assert await store.complete(lease, b"x") is True
        return
    reservation = await store.reserve(key, "fp", lease_ttl=lease_ttl, retention=retention)
    assert reservation.outcome is Outcome.ACQUIRED
    lease = reservation.lease
    assert lease is not None
    extended = await store.extend(lease, lease_ttl=lease_ttl)
    completed = await store.complete(extended or lease, b"done")
    if float(lease_ttl) >= 10 and float(retention) >= 10:
        # Long enough that nothing may have lapsed on the way: all of it must have worked.
        assert extended is not None
        assert completed is True
        record = await store.get(key)
        assert record is not None and record.response == b"done"
        assert record.expires_at >= record.created_at + min(float(retention), 10.0) - 1


timeout_value = st.one_of(
    st.floats(),
    st.integers(-(10**30), 10**30),
    st.sampled_from([0, -1, 10**400, True, None, "1", b"1", [1]]),
)


@STORE_SETTINGS
@given(timeout=timeout_value, limit=st.one_of(st.integers(), st.floats(), st.none(), st.text()))
@example(timeout=math.nan, limit=0)
@example(timeout=math.inf, limit=-1)
@example(timeout="1", limit="5")
@example(timeout=None, limit=2.5)
@example(timeout=10**400, limit=True)
async def test_wait_timeouts_and_sweep_limits_of_any_shape(
    store: IdempotencyStore, timeout: Any, limit: Any
) -> None:
    lease = await fresh_lease(store)
    assert await store.complete(lease, b"r") is True
    # Documented: any number of seconds, 0 or more; huge or infinite means no limit.
    valid_timeout = (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and timeout == timeout
        and timeout >= 0
    )
    event(f"timeout {'valid' if valid_timeout else 'invalid'}")
    if valid_timeout:
        # Not held by a lease: returns at once whatever the timeout.
        record = await store.wait(lease.key, timeout=timeout)
        assert record is not None and record.response == b"r"
    else:
        with pytest.raises(ConfigurationError):
            await store.wait(lease.key, timeout=timeout)
    valid_limit = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1
    event(f"limit {'valid' if valid_limit else 'invalid'}")
    if valid_limit:
        assert await store.sweep(limit=limit) >= 0
    else:
        with pytest.raises(ConfigurationError):
            await store.sweep(limit=limit)
    # Nothing of the above removed a live record.
    assert await store.get(lease.key) is not None


async def test_a_lease_with_a_forged_identity_is_fenced_out(store: IdempotencyStore) -> None:
    """complete/release/extend take the lease's scope and key as given: a lease whose fields
    were tampered with (metacharacters, another scope) must fail the owner check, not match
    another record."""
    lease = await fresh_lease(store, scope="tenant-a")
    forged = [
        type(lease)(scope, key, token, fence, lease.lease_expires_at, lease.retention)
        for scope, key, token, fence in [
            ("tenant-b", lease.key, lease.token, lease.fence),
            ("tenant-a%", lease.key, lease.token, lease.fence),
            ("tenant-a", lease.key + "' OR '1'='1", lease.token, lease.fence),
            ("tenant-a", lease.key, "' OR '1'='1", lease.fence),
            ("tenant-a", lease.key, lease.token + "]]", lease.fence),
            ("tenant-a", lease.key, lease.token, lease.fence + 1),
            ("tenant-a", lease.key, lease.token, 0),
            ("tenant-a", lease.key, lease.token, 2**64),
            ("tenant-a", lease.key, lease.token, -(2**70)),
        ]
    ]
    for bad in forged:
        assert await store.complete(bad, b"forged") is False
        assert await store.extend(bad, lease_ttl=LONG) is None
        assert await store.release(bad) is False
    record = await store.get(lease.key, scope="tenant-a")
    assert record is not None and record.status is Status.IN_PROGRESS
    assert await store.complete(lease, b"genuine") is True


# -- store URLs ----------------------------------------------------------------------------

URL_OPTION_NAMES = [
    "max_key_length",
    "prefix",
    "db",
    "socket_timeout",
    "operation_timeout",
    "retries",
    "expiry_grace",
    "ssl",
    "ssl_ca_certs",
    "synchronous",
    "busy_timeout",
    "auto_migrate",
    "region",
    "endpoint_url",
    "clock_skew",
    "compress_min_bytes",
    "max_attempts",
    "password",
    "colour",
    "",
]
URL_OPTION_VALUES = [
    "",
    "0",
    "-1",
    "1",
    "1e400",
    "nan",
    "inf",
    "-inf",
    "true",
    "maybe",
    "\x00",
    "%00",
    "é",
    "{}",
    "'; DROP TABLE x; --",
    "9" * 5000,
    "http://127.0.0.1:1",
]


def _password_marker(suffix: str) -> str:
    return f"Pw{suffix}Zq"


_url_parts = st.fixed_dictionaries(
    {
        "scheme": st.one_of(
            st.sampled_from(
                [
                    *known_schemes(),
                    "REDIS",
                    "Sqlite",
                    "mongodb",
                    "http",
                    "",
                    "redis+",
                    "dynamodb ",
                ]
            ),
            st.text(max_size=6),
        ),
        "separator": st.sampled_from(["://", "://", "://", ":/", ":", ":///", "//", ""]),
        "user": st.sampled_from(["", "user", "u%40x", "ü", "user:"]),
        "secret": st.text("abcdef0123456789", min_size=6, max_size=10).map(_password_marker),
        "secret_tail": st.sampled_from(
            ["", "%40", "%2F", "%3A", "é", "!$&'()*+,;=", "\uff20x", "\uff03", "/x", "?x", "#x"]
        ),
        "with_password": st.booleans(),
        "host": st.sampled_from(
            [
                "127.0.0.1",
                "localhost",
                "[::1]",
                "[::1",
                "",
                "h1:1,h2:2",
                "h1,,h2",
                "höst",
                "idem_table",
                "ab",
                "t" * 300,
                "h" * 100_000,
                "%00",
                "a b",
            ]
        ),
        "port": st.sampled_from(
            ["", ":0", ":1", ":6379", ":65535", ":65536", ":-1", ":abc", ":99999999999", ": 1", ":"]
        ),
        "path": st.sampled_from(
            ["", "/", "/0", "/15", "/-1", "/x", "/:memory:", "/x.db", "//abs.db", "/%00", "/\x00"]
        ),
        "options": st.lists(
            st.tuples(
                st.one_of(*[st.sampled_from(URL_OPTION_NAMES)] * 3, st.text(max_size=4)),
                st.one_of(*[st.sampled_from(URL_OPTION_VALUES)] * 3, st.text(max_size=6)),
            ),
            max_size=3,
        ),
    }
)


def _canonical_parts(scheme: str, host: str, path: str) -> dict[str, Any]:
    """scheme://user:secret@host PATH, as _url_parts would draw it."""
    return {
        "scheme": scheme,
        "separator": "://",
        "user": "user",
        "secret": _password_marker("c0ffee42"),
        "secret_tail": "%2F",
        "with_password": True,
        "host": host,
        "port": "",
        "path": path,
        "options": [],
    }


def _build_url(parts: dict[str, Any]) -> tuple[str, str | None]:
    secret = parts["secret"] + parts["secret_tail"] if parts["with_password"] else None
    userinfo = ""
    if secret is not None:
        userinfo = f"{parts['user']}:{secret}@"
    elif parts["user"]:
        userinfo = f"{parts['user']}@"
    query = "&".join(f"{name}={value}" for name, value in parts["options"])
    url = (
        f"{parts['scheme']}{parts['separator']}{userinfo}{parts['host']}{parts['port']}"
        f"{parts['path']}{'?' + query if query else ''}"
    )
    return url, secret


def error_texts(exc: BaseException) -> list[str]:
    """str and repr of the error and of every error chained to it, as a traceback shows them
    (``raise ... from None`` hides the context)."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts += [str(current), repr(current), *map(str, current.args)]
        if current.__cause__ is not None or current.__suppress_context__:
            current = current.__cause__
        else:
            current = current.__context__
    return texts


def log_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    texts = []
    for record in caplog.records:
        texts.append(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            texts += error_texts(record.exc_info[1])
        if record.exc_text:
            texts.append(record.exc_text)
    return texts


def assert_secret_hidden(texts: list[str], secret: str | None) -> None:
    if secret is None:
        return
    from urllib.parse import unquote

    for form in {secret, unquote(secret), secret[: len(secret) - 2]}:
        for text in texts:
            assert form not in text, f"the password {form!r} leaked: {text[:300]!r}"


@settings(OVER_ONE_FIXTURE, max_examples=400)
@given(parts=_url_parts)
@example(parts=_canonical_parts("dynamodb", "idem_table", ""))
@example(parts=_canonical_parts("dynamodb", "idem_table", "?region=us-east-1"))
@example(parts=_canonical_parts("redis", "127.0.0.1:99999", ""))
@example(parts=_canonical_parts("redis", "127.0.0.1:abc", "/0"))
@example(parts=_canonical_parts("redis+cluster", "h1:1,h2:x", ""))
@example(parts=_canonical_parts("rediss", "[::1", ""))
@example(parts=_canonical_parts("sqlite", "host", "/x.db"))
@example(parts=_canonical_parts("memory", "", ""))
@example(parts=_canonical_parts("postgresql", "db:5432", "/main"))
@example(parts=_canonical_parts("mongodb", "db", ""))
async def test_a_url_of_any_shape_opens_or_is_a_configuration_error_without_its_password(
    caplog: pytest.LogCaptureFixture, parts: dict[str, Any]
) -> None:
    from idemstore import MissingDependencyError, open_store

    caplog.clear()
    url, secret = _build_url(parts)
    with caplog.at_level("DEBUG"):
        try:
            opened = open_store(url)
        except (ConfigurationError, MissingDependencyError) as exc:
            event(f"url refused: {type(exc).__name__}")
            assert_secret_hidden(error_texts(exc), secret)
        else:
            # No I/O happened (open_store never connects): only close it.
            event(f"url opened: {type(opened).__name__}")
            assert_secret_hidden([repr(opened), str(opened)], secret)
            await opened.close()
    assert_secret_hidden(log_texts(caplog), secret)


@pytest.mark.parametrize(
    "value", [None, 42, b"redis://h", ["memory://"], "", " ", "\x00", "://", "é" * 100_000]
)
def test_a_store_url_that_is_not_a_url_string_is_a_configuration_error(value: Any) -> None:
    from idemstore import open_store

    with pytest.raises(ConfigurationError):
        open_store(value)


# -- a store that cannot connect, with a password in its URL --------------------------------

SECRET = "PwS3cr3tN0tLeakedZq"


def _with_credentials(url: str, *, port: int | None, secret: str = SECRET) -> str:
    """``url`` with user ``idem`` and password ``secret``, on ``port`` if given."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    if port is not None:
        hosts = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"idem:{secret}@{hosts}"))


def _failing_url(case: str, request: pytest.FixtureRequest) -> str:
    from idemstore.local_servers import free_port

    closed = free_port()  # nothing listens there
    if case == "redis-closed-port":
        return f"redis://idem:{SECRET}@127.0.0.1:{closed}/0?socket_connect_timeout=1&retries=0"
    if case == "redis-wrong-password":
        url = request.getfixturevalue("redis_server_url")
        return _with_credentials(url, port=None) + "?retries=0"
    if case == "redis-cluster-closed-port":
        return f"redis+cluster://idem:{SECRET}@127.0.0.1:{closed}?socket_connect_timeout=1"
    if case == "dynamodb-endpoint-with-password":
        request.getfixturevalue("dynamodb_endpoint")  # the dummy credentials
        endpoint = f"http://idem:{SECRET}@127.0.0.1:{closed}"
        return f"dynamodb://idem_table?region=us-east-1&endpoint_url={endpoint}&max_attempts=1"
    if case.startswith("postgres"):
        # Postgres arrives by merge: until then this case skips.
        try:
            url = request.getfixturevalue("postgres_store_url")
        except pytest.FixtureLookupError:
            pytest.skip("no postgres_store_url fixture in this checkout yet")
        url = url.split("?", 1)[0]
        return _with_credentials(url, port=closed if case == "postgres-closed-port" else None)
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "redis-closed-port",
        "redis-wrong-password",
        "redis-cluster-closed-port",
        "dynamodb-endpoint-with-password",
        "postgres-closed-port",
        "postgres-wrong-password",
    ],
)
async def test_a_store_that_cannot_connect_never_shows_its_password(
    case: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    from idemstore import IdemstoreError, StoreUnavailableError, open_store

    url = _failing_url(case, request)
    texts: list[str] = []
    failures: list[type[BaseException]] = []
    with caplog.at_level("DEBUG"):
        try:
            store = open_store(url)
        except ConfigurationError as exc:
            # Refusing such a URL up front is fine too, if it keeps the password to itself.
            texts += error_texts(exc)
            failures.append(type(exc))
        else:
            texts += [repr(store), str(store)]
            for attempt in (
                store.ping(),
                store.reserve("k", "fp", lease_ttl=LONG, retention=LONG),
                store.get("k"),
            ):
                try:
                    await attempt
                except IdemstoreError as exc:
                    texts += error_texts(exc)
                    failures.append(type(exc))
            await store.close()
            try:
                async with open_store(url):
                    pass
            except IdemstoreError as exc:
                texts += error_texts(exc)
                failures.append(type(exc))
    texts += log_texts(caplog)
    assert_secret_hidden(texts, SECRET)
    if case != "postgres-wrong-password":  # a trust pg_hba.conf accepts any password
        assert failures, "the store connected"
    assert set(failures) <= {ConfigurationError, StoreUnavailableError}


# -- the canonical argument hasher ---------------------------------------------------------


class _Opaque:
    """Not JSON."""


_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**310),
    st.floats(),  # NaN and infinities included: they are not JSON
    st.text(),
    _with_surrogate,
    _metachar,
)
_not_json = st.one_of(
    st.binary(max_size=4),
    st.builds(bytearray, st.binary(max_size=4)),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.complex_numbers(),
    st.decimals(),
    st.datetimes(),
    st.builds(_Opaque),
    st.sampled_from([Ellipsis, NotImplemented, type, print]),
)
_key = st.one_of(
    st.text(max_size=6),
    _with_surrogate,
    st.integers(),
    st.none(),
    st.booleans(),
    st.floats(),
    st.tuples(st.integers()),
    st.binary(max_size=2),
)
json_ish = st.recursive(
    st.one_of(_json_scalar, _not_json),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(_key, children, max_size=4),
    ),
    max_leaves=20,
)


def _deep(depth: int, *, as_dict: bool) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


def _cycle() -> object:
    looped: list[object] = []
    looped.append(looped)
    return {"a": looped}


@settings(max_examples=1000, deadline=None, database=None)
@given(value=json_ish)
@example(value={"a": [1, {"b": float("nan")}]})
@example(value={"\ud800": 1})
@example(value={(1,): 1})
@example(value="\udfff")
def test_canonical_json_of_any_value_succeeds_or_is_a_canonicalization_error(
    value: object,
) -> None:
    import json

    from idemstore import CanonicalizationError
    from idemstore.hashing import canonical_json, fingerprint

    try:
        text = canonical_json(value)
    except CanonicalizationError as exc:
        event("canonicalization refused")
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert isinstance(refused.path, str)
        str(refused).encode("utf-8")  # the message itself is printable
        with pytest.raises(CanonicalizationError):
            fingerprint(value)
        return
    event("canonicalized")
    # Valid UTF-8 JSON without NaN or Infinity. (Not necessarily its own canonical form once
    # parsed back: a parser reads "24287118933160390", a double's text, as an exact int.)
    json.loads(text.decode("utf-8"), parse_constant=_refuse_constant)
    digest = fingerprint(value)
    assert len(digest) == 64 and int(digest, 16) >= 0


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (_deep(500, as_dict=False), True),
        (_deep(1001, as_dict=False), False),
        (_deep(100_000, as_dict=True), False),
        (_deep(100_000, as_dict=False), False),
        (_cycle(), False),
    ],
    ids=["depth-500", "depth-1001", "dict-depth-100000", "list-depth-100000", "cycle"],
)
def test_deep_nesting_and_cycles_are_refused_cleanly(value: object, ok: bool) -> None:
    from idemstore import CanonicalizationError
    from idemstore.hashing import fingerprint

    if ok:
        assert len(fingerprint(value)) == 64
    else:
        with pytest.raises(CanonicalizationError, match="nested too deeply"):
            fingerprint(value)


@pytest.mark.parametrize("wrap", [lambda n: n, lambda n: [n], lambda n: {"k": n}])
def test_an_integer_too_long_to_write_is_a_canonicalization_error(wrap: Any) -> None:
    from idemstore import CanonicalizationError
    from idemstore.hashing import fingerprint

    with pytest.raises(CanonicalizationError):
        fingerprint(wrap(10**5000))


def _refuse_constant(name: str) -> object:
    raise AssertionError(f"canonical JSON holds {name}")
