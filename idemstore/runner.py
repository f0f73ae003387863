"""The runner: run a piece of work at most once per key over any store.

``Idempotency`` is the execution path of ``idemstore.execution`` with a decorator on top; it
adds no rules of its own.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypedDict, TypeVar, Unpack

from idemstore.errors import ConfigurationError, InvalidKeyError
from idemstore.execution import ExecutionPolicy, Replay, Result, TakeoverPolicy
from idemstore.execution.running_work import running
from idemstore.fingerprint_fields import field_selection
from idemstore.forwarded_options import reject_unknown
from idemstore.hashing import fingerprint as canonical_fingerprint
from idemstore.serializers import JSONSerializer, Serializer, return_type

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from idemstore.fingerprint_fields import FieldSelection
    from idemstore.protocol import IdempotencyStore

__all__ = ["DecoratorOptions", "Idempotency", "PolicyOptions", "Result"]

logger = logging.getLogger("idemstore.runner")

P = ParamSpec("P")
T = TypeVar("T")


class PolicyOptions(TypedDict, total=False):
    """The execution options ``Idempotency`` takes, declared once for it and the doors that
    forward them (``idemstore.sync``); ``ExecutionPolicy`` holds their defaults and checks."""

    lease_ttl: float
    retention: float
    in_flight: Literal["wait", "reject"]
    wait_timeout: float | None
    on_failure: Literal["release", "hold"]
    on_takeover: TakeoverPolicy
    max_response_bytes: int | None


class DecoratorOptions(TypedDict, total=False):
    """The options of ``Idempotency.idempotent`` after ``key``, declared once for it and the
    doors that forward them (``idemstore.sync``); ``idempotent`` holds their defaults."""

    scope: str | Callable[..., str]
    require_key: bool
    serializer: Serializer | None
    fingerprint_exclude: Iterable[str] | None
    fingerprint_include: Iterable[str] | None


class Idempotency:
    """Execute work at most once per ``(scope, key)``, replaying the stored result to retries.

    Args:
        store: any ``IdempotencyStore``.
        lease_ttl: seconds a caller holds a key without a heartbeat; heartbeats extend it.
        retention: seconds a completed result is replayed.
        in_flight: ``"wait"`` for a running original and return its result, or
            ``"reject"`` with ``InProgressError`` at once.
        wait_timeout: seconds to wait for a running original (``None``: without limit).
        on_failure: ``"release"`` the key when the work raises (a retry runs it again) or
            ``"hold"`` it until the lease lapses (never risk a second run in that window). A
            cancellation of the caller while the work runs is a failure too.
        on_takeover: when a key's holder lost its lease without recording an outcome (it
            may have done the work and died), ``"run"`` the work again (``Result.takeover``
            and ``current_execution().takeover`` say so) or ``"refuse"``: raise
            ``OutcomeUnknownError`` to this caller and every retry, and run nothing.
        max_response_bytes: the largest result recorded (``None``: the store's limit). A
            larger one is returned to its caller; the key records its size, and retries get
            ``OutcomeTooLargeError`` rather than a second run.
        serializer: how ``idempotent`` records results and rebuilds them for replays
            (``None``: ``JSONSerializer()``, for JSON values, dataclasses, pydantic models).

    The options but ``serializer`` are ``ExecutionPolicy``'s, with its defaults (the API
    reference shows each in the signature).
    """

    __slots__ = ("_policy", "serializer")

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        serializer: Serializer | None = None,
        **policy: Unpack[PolicyOptions],
    ) -> None:
        reject_unknown(policy, PolicyOptions, "Idempotency()")
        # A callable on_failure is ExecutionPolicy's alone; the policy checks the rest.
        on_failure = policy.get("on_failure", "release")
        if on_failure not in ("release", "hold"):
            raise ConfigurationError(f"on_failure must be 'release' or 'hold', not {on_failure!r}")
        self._policy = ExecutionPolicy(store, **policy)
        self.serializer: Serializer = _checked(serializer)

    @property
    def policy(self) -> ExecutionPolicy:
        """The execution policy this runner applies (``begin`` for finer control)."""
        return self._policy

    @property
    def store(self) -> IdempotencyStore:
        return self._policy.store

    @property
    def lease_ttl(self) -> float:
        return self._policy.lease_ttl

    @property
    def retention(self) -> float:
        return self._policy.retention

    @property
    def in_flight(self) -> Literal["wait", "reject"]:
        return self._policy.in_flight

    @property
    def wait_timeout(self) -> float | None:
        return self._policy.wait_timeout

    @property
    def on_failure(self) -> Literal["release", "hold"]:
        return self._policy.on_failure  # type: ignore[return-value]

    @property
    def on_takeover(self) -> TakeoverPolicy:
        return self._policy.on_takeover

    @property
    def max_response_bytes(self) -> int | None:
        return self._policy.max_response_bytes

    async def run(
        self,
        key: str,
        fingerprint: str,
        work: Callable[[], Awaitable[bytes]],
        *,
        scope: str = "",
    ) -> Result:
        """Run ``work`` unless this key already ran (then replay it) or is running.

        ``work`` is an ``async def`` function, or a zero-argument callable that returns an
        awaitable (``lambda: charge(args)`` with an async ``charge``), of the bytes to record.
        A plain ``def`` function is refused with ``TypeError`` before anything is reserved
        or run. A callable that turns out, once called, to return no awaitable (or work whose
        result is not bytes) did run: the key records that, and this call and every retry
        raise ``UnrecordableResultError`` (a ``TypeError``) instead of running it again.

        Raises ``ConflictError`` when the key was used with another fingerprint and
        ``InProgressError`` when another caller holds it and the policy is not to wait;
        ``LeaseLostError``, ``OutcomeUnknownError``, ``OutcomeTooLargeError`` as
        ``ExecutionPolicy.begin`` says. Whatever ``work`` raises propagates, after the
        failure policy is applied; a cancellation of the caller, at any point, is a failure
        too (and a ``reserve`` still in flight when it lands is released, so no lease is
        left that nobody owns). ``idemstore.current_execution()`` tells the work about its
        execution (``takeover``, ``previous_fence``, ``fence``).
        """
        return await self._policy.run(key, fingerprint, work, scope=scope)

    def idempotent(
        self,
        key: str | Callable[..., str],
        *,
        scope: str | Callable[..., str] = "",
        require_key: bool = False,
        serializer: Serializer | None = None,
        fingerprint_exclude: Iterable[str] | None = None,
        fingerprint_include: Iterable[str] | None = None,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """Decorate an async function so each key runs it once and retries get its result.

        ``key`` names the argument that holds the idempotency key, or is a callable given the
        function's arguments that returns it; ``scope`` likewise (a constant string by
        default). The fingerprint covers the function's qualified name and all its bound
        arguments (canonical JSON), so those must be JSON values. Decorating a plain ``def``
        function is a ``TypeError``: use ``async def``, or ``idemstore.sync.Idempotency``.

        The result is recorded by ``serializer`` (the runner's by default, ``JSONSerializer``
        unless it was given one): JSON values, dataclasses and pydantic models. Every call,
        the first and its replays alike, returns what the serializer rebuilds from the
        recorded bytes, given the function's return annotation (``JSONSerializer``: the same
        dataclass or model type when the annotation is one, else the JSON value: a tuple
        comes back as a list), so a first call and its retries return equal values. A
        result the serializer refuses is a mistake found after the work ran: the key records
        that, and this call and every retry raise ``UnrecordableResultError`` (a
        ``TypeError`` naming the type) instead of running the function again.

        A key that is ``None`` means "no key": the call runs without deduplication (as a
        request without an ``Idempotency-Key`` does), unless ``require_key`` is true, which
        raises ``InvalidKeyError`` instead. Any other key is used as ``str(key)``.

        ``fingerprint_exclude`` leaves arguments, or fields inside them, out of the
        fingerprint: JSON pointers (RFC 6901) into the arguments as an object of argument
        name to value (``"/trace_id"``, ``"/order/sent_at"``), so a retry that differs only
        there replays instead of raising ``ConflictError``; ``fingerprint_include`` names
        the only ones it covers. The first token of each must be an argument's name
        (``ConfigurationError`` at decoration otherwise). The risk: a left-out value that
        changes what the call does makes two different calls share one result.
        """
        chosen = self.serializer if serializer is None else _checked(serializer)
        fields = field_selection(fingerprint_include, fingerprint_exclude)
        policy = self._policy

        def decorate(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            if not inspect.iscoroutinefunction(func):
                raise TypeError(
                    f"@idempotent needs an `async def` function; {_name(func)} is not one"
                    " (a plain function would no longer run when its caller calls it); for"
                    " plain functions use idemstore.sync.Idempotency's @idempotent"
                )
            signature = _checked_signature(func, key, fields)
            name = f"{func.__module__}.{func.__qualname__}"
            recorder = _Recorder(policy, chosen, name, func)

            @functools.wraps(func)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                arguments = dict(bound.arguments)
                the_key = key(*args, **kwargs) if callable(key) else arguments[key]
                if the_key is None:
                    # str(None) would put every keyless call under the one key "None".
                    if require_key:
                        raise InvalidKeyError(
                            f"{func.__qualname__} was called without an idempotency key"
                            f" ({key if isinstance(key, str) else 'the key'} is None); pass"
                            " one, or drop require_key=True to run such calls without"
                            " deduplication"
                        )
                    return await func(*args, **kwargs)
                the_scope = scope(*args, **kwargs) if callable(scope) else scope
                covered = arguments if fields is None else fields.apply(arguments)
                print_ = canonical_fingerprint({"function": name, "arguments": covered})
                call = functools.partial(func, *args, **kwargs)
                return await recorder.run(str(the_key), print_, the_scope, call)  # type: ignore[no-any-return]

            return wrapper

        return decorate


def _checked_signature(
    func: Callable[..., Any], key: str | Callable[..., str], fields: FieldSelection | None
) -> inspect.Signature:
    """``func``'s signature, once the argument names the decorator was given are its own."""
    signature = inspect.signature(func)
    if isinstance(key, str) and key not in signature.parameters:
        raise ConfigurationError(f"{func.__qualname__} has no argument named {key!r}")
    unknown = set() if fields is None else fields.first_tokens() - set(signature.parameters)
    if unknown:
        raise ConfigurationError(
            f"fingerprint_include/fingerprint_exclude: {func.__qualname__} has no"
            f" argument named {', '.join(sorted(map(repr, unknown)))}; a pointer"
            " starts with an argument's name, such as"
            f" {'/' + next(iter(signature.parameters), 'order')!r}"
        )
    return signature


class _Recorder:
    """Runs a decorated function's calls, recording results through its serializer."""

    __slots__ = ("_func", "_returns", "name", "policy", "serializer")

    def __init__(
        self, policy: ExecutionPolicy, serializer: Serializer, name: str, func: object
    ) -> None:
        self.policy = policy
        self.serializer = serializer
        self.name = name
        self._func = func
        self._returns: list[Any] = []

    @property
    def returns(self) -> Any:
        """The return annotation, resolved at the first call (forward references may not
        resolve at decoration time)."""
        if not self._returns:
            self._returns.append(return_type(self._func))
        return self._returns[0]

    async def run(
        self, key: str, fingerprint: str, scope: str, call: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Replay the key, or run ``call`` and record its result."""
        claim = await self.policy.begin(key, fingerprint, scope=scope)
        if isinstance(claim, Replay):
            return self.serializer.loads(claim.response, self.returns)
        async with claim:
            with running(claim):
                value = await call()
            try:
                data = self.serializer.dumps(value)
            except Exception as exc:
                # The function ran: a retry must get this error, not run it again.
                why = f"{self.name} returned {type(value).__qualname__}, not recordable: {exc}"
                raise await claim.settle_unrecordable(why) from exc
            await claim.settle(data)
        # What a replay will return, so the first call and its retries agree.
        return self.serializer.loads(data, self.returns)


def _checked(serializer: Serializer | None) -> Serializer:
    if serializer is None:
        return JSONSerializer()
    if not callable(getattr(serializer, "dumps", None)) or not callable(
        getattr(serializer, "loads", None)
    ):
        raise ConfigurationError(
            f"serializer must have dumps(value) -> bytes and loads(data, returns) methods, not"
            f" {serializer!r}"
        )
    return serializer


def _name(func: object) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
