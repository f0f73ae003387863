"""The commands an operator finds and fixes one key with: ``idemstore keys`` (list records by
state, scope and age), ``idemstore forget`` (remove one), and the caller options of
``idemstore inspect`` (the scope a door derives from a credential or a user)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, cast

from idemstore.argument_types import duration, positive_int
from idemstore.backends.forgetting import forget, running_lease
from idemstore.backends.urls import open_store
from idemstore.callers import CallerSources, Principal, scope_of_caller
from idemstore.errors import ConfigurationError
from idemstore.protocol import ListingStore, Status, offers
from idemstore.records import RecordState

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Coroutine
    from typing import Any

    from idemstore.protocol import Record

    Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
    StoreCommand = Callable[..., argparse.ArgumentParser]

__all__ = ["add_caller_options", "add_record_commands", "scope_of_arguments"]

EXIT_ABSENT = 1
# The realm a user id of `--user` is in when `--realm` is not given: the ASGI scope["user"].
DEFAULT_REALM = "user"


def add_caller_options(
    command: argparse.ArgumentParser, scope_help: str = "the record scope, as stored (default: '')"
) -> None:
    """``--scope``, or the caller the scope is derived from (``--caller``, ``--user``)."""
    given = command.add_mutually_exclusive_group()
    given.add_argument("--scope", help=scope_help)
    given.add_argument(
        "--caller",
        metavar="CREDENTIAL",
        help="an Authorization header value ('Bearer ...'): the scope an HTTP door gives a"
        " request that carries it and no verified principal",
    )
    given.add_argument(
        "--user",
        metavar="ID",
        help="a verified principal's subject (a user id): the scope an HTTP door gives its"
        " requests; its kind is --realm",
    )
    command.add_argument(
        "--realm",
        default=DEFAULT_REALM,
        help="with --user: the principal's realm: user (ASGI scope['user'], the default),"
        " django-user, remote-user, jwt, app (a caller= callable)",
    )


def scope_of_arguments(args: argparse.Namespace, namespace: str) -> str:
    """The scope ``--scope`` names, or the one the doors of ``namespace`` derive from
    ``--caller`` or ``--user``/``--realm`` (``idemstore.callers.scope_of_caller``)."""
    if args.caller is not None:
        headers = [("authorization", args.caller)]
        scope = scope_of_caller(namespace, None, CallerSources(), headers)
        if scope is None:
            raise ConfigurationError(
                f"{args.caller!r} names nobody (a scheme without a credential, or empty):"
                " a door refuses such a request rather than keep a record for it"
            )
        return scope
    if args.user is not None:
        principal = Principal.of(args.realm, args.user)
        if principal is None:
            raise ConfigurationError(f"--user {args.user!r} names nobody")
        return cast("str", scope_of_caller(namespace, principal, None))
    return cast("str", args.scope or "")


def add_record_commands(commands: Any, store_command: StoreCommand, namespace: str) -> None:
    """``keys`` and ``forget``, made with the CLI's ``store_command`` (URL first); scopes of
    ``--caller``/``--user`` are those of the doors' ``namespace``."""
    keys = store_command(
        commands,
        "keys",
        _keys_in(namespace),
        help="list live records: in progress, stuck (lease past its deadline) or completed",
        description="List the live records of a store, oldest first where the engine can"
        " sort (SQL), filtered by state, scope and age. Redis and DynamoDB scan until --limit"
        " records match.",
    )
    keys.add_argument(
        "--state",
        choices=[state.value for state in RecordState],
        help="only records in this state (default: every state)",
    )
    add_caller_options(keys, "only records of this scope, as stored (default: every scope)")
    keys.add_argument(
        "--older-than",
        type=duration,
        metavar="D",
        help="only records created more than D ago: 90s, 15m, 2h, 1d",
    )
    keys.add_argument(
        "--limit", type=positive_int, default=100, metavar="N", help="at most N (default 100)"
    )
    keys.add_argument("--json", action="store_true", help="one JSON object per record")

    gone = store_command(
        commands,
        "forget",
        _forget_in(namespace),
        help="remove one record (asks first; logs who removed what)",
        description="Remove the live record of KEY, after a bug: shows it and asks unless"
        " --yes; refuses a running lease unless --force. Logged at WARNING on idemstore.admin.",
    )
    gone.add_argument("key", metavar="KEY")
    add_caller_options(gone)
    gone.add_argument("--yes", "-y", action="store_true", help="do not ask")
    gone.add_argument(
        "--force", action="store_true", help="remove it even while its lease is running"
    )


def _state(record: Record, now: float) -> str:
    if record.status is Status.COMPLETED:
        return RecordState.COMPLETED.value
    return (RecordState.IN_PROGRESS if running_lease(record, now) else RecordState.STUCK).value


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _keys_in(namespace: str) -> Handler:
    async def keys(args: argparse.Namespace) -> int:
        chosen = args.scope is not None or args.caller is not None or args.user is not None
        scope = scope_of_arguments(args, namespace) if chosen else None
        async with open_store(args.url) as store:
            if not offers(store, ListingStore):
                raise ConfigurationError(
                    f"this store ({type(store).__name__}) cannot list its records"
                )
            listing = cast("ListingStore", store)
            found = [
                record
                async for record in listing.records(
                    scope=scope, state=args.state, older_than=args.older_than, limit=args.limit
                )
            ]
        now = time.time()
        if not args.json:
            print(f"{'STATE':<11} {'FENCE':>5}  {'CREATED':<20}  {'LEASE UNTIL':<20}  SCOPE  KEY")
        for record in found:
            state = _state(record, now)
            if args.json:
                print(json.dumps(_as_json(record, state)))
            else:
                lease = _when(record.lease_expires_at)
                print(
                    f"{state:<11} {record.fence:>5}  {_when(record.created_at):<20}"
                    f"  {lease:<20}  {record.scope!r}  {record.key!r}"
                )
        if not found:
            print("no live record matches", file=sys.stderr)
        return 0

    return keys


def _as_json(record: Record, state: str) -> dict[str, object]:
    return {
        "scope": record.scope,
        "key": record.key,
        "state": state,
        "fence": record.fence,
        "fingerprint": record.fingerprint,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "lease_expires_at": record.lease_expires_at,
    }


def _forget_in(namespace: str) -> Handler:
    async def forget_command(args: argparse.Namespace) -> int:
        scope = scope_of_arguments(args, namespace)
        async with open_store(args.url) as store:
            record = await store.get(args.key, scope=scope)
            if record is None:
                print(f"no live record for key {args.key!r} in scope {scope!r}", file=sys.stderr)
                return EXIT_ABSENT
            state = _state(record, time.time())
            shown = f"{state} record of key {args.key!r} in scope {scope!r}, fence {record.fence}"
            if not args.yes and not _confirmed(f"forget the {shown}? [y/N] "):
                print("nothing removed", file=sys.stderr)
                return EXIT_ABSENT
            # The record the operator was shown, not whatever holds the key by now.
            await forget(store, args.key, scope=scope, force=args.force, fence=record.fence)
        print(f"forgot the {shown}")
        return 0

    return forget_command


def _confirmed(question: str) -> bool:
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}
