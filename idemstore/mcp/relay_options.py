"""The deduplication options of an MCP relay, declared once for the proxy, the gateway and the CLI.

``RelayOptions`` is the value ``ToolCallCore`` (the stdio proxy) and the gateway's
``ToolCalls`` take; ``add_arguments`` declares the matching command-line flags and
``RelayOptions.from_args`` reads them back, so an option added here reaches every relay and
both subcommands at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from idemstore.argument_types import positive_float
from idemstore.errors import ConfigurationError
from idemstore.records import check_duration

if TYPE_CHECKING:
    import argparse

__all__ = ["RelayOptions", "add_arguments"]


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """How a relay deduplicates ``tools/call``.

    Attributes:
        run_id: scope of derived keys (``None``: a new UUID per relay); relays that share it
            deduplicate key-less calls together.
        lease_ttl: seconds a call holds its key without a heartbeat (heartbeats every third).
        retention: seconds a derived or ``_meta`` key's result is replayed.
        sep_retention: seconds a SEP-3182 key's outcome is replayed.
        in_flight: derived and ``_meta`` keys: ``"wait"`` for a running original, or
            ``"reject"``. SEP-3182 keys always reject.
        implicit: derive keys for calls that carry none.
        tools / exclude_tools: glob patterns of the tools that get / never get derived keys.
        dedupe_read_only: derive keys for tools annotated ``readOnlyHint: true`` too.
        cancel_grace: seconds a cancelled, forwarded SEP call keeps its key without an answer.
        on_takeover: a key taken over from a holder whose lease lapsed without an outcome:
            ``"run"`` the call again, or ``"refuse"`` it with an outcome-unknown error (see
            ``ExecutionPolicy``).
    """

    run_id: str | None = None
    lease_ttl: float = 30.0
    retention: float = 600.0
    sep_retention: float = 86400.0
    in_flight: Literal["wait", "reject"] = "wait"
    implicit: bool = True
    tools: tuple[str, ...] = ("*",)
    exclude_tools: tuple[str, ...] = ()
    dedupe_read_only: bool = False
    cancel_grace: float = 60.0
    on_takeover: Literal["run", "refuse"] = "run"

    def __post_init__(self) -> None:
        for name in ("lease_ttl", "retention", "sep_retention", "cancel_grace"):
            object.__setattr__(self, name, check_duration(name, getattr(self, name)))
        if self.in_flight not in ("wait", "reject"):
            raise ConfigurationError(
                f"in_flight must be 'wait' or 'reject', not {self.in_flight!r}"
            )
        if self.on_takeover not in ("run", "refuse"):
            raise ConfigurationError(
                f"on_takeover must be 'run' or 'refuse', not {self.on_takeover!r}"
            )
        for name in ("tools", "exclude_tools"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigurationError(f"{name} is a sequence of glob patterns, not {value!r}")
            object.__setattr__(self, name, tuple(value))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RelayOptions:
        """The options ``add_arguments``' flags were given."""
        return cls(
            run_id=args.run_id,
            lease_ttl=args.lease,
            retention=args.retention if args.retention is not None else _DEFAULTS.retention,
            sep_retention=args.sep_retention,
            in_flight=args.in_flight,
            implicit=not args.no_implicit,
            tools=tuple(args.tools or ("*",)),
            exclude_tools=tuple(args.exclude_tools or ()),
            dedupe_read_only=args.dedupe_read_only,
            cancel_grace=args.cancel_grace,
            on_takeover=args.on_takeover,
        )


def add_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """The command-line flags of ``RelayOptions`` (and ``--log-level``), for both relays."""
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="scope of derived keys (default: one per process); relays that share it "
        "deduplicate key-less calls together",
    )
    # No default given: the proxy's --ttl-ms may set it instead (from_args fills it in).
    _add_seconds(
        parser,
        "--retention",
        "retention",
        "how long a derived or _meta key's result is replayed",
        given=False,
    )
    _add_seconds(
        parser, "--sep-retention", "sep_retention", "how long a SEP-3182 key's outcome is replayed"
    )
    _add_seconds(parser, "--lease", "lease_ttl", "lease of a running call, heartbeated every third")
    parser.add_argument(
        "--in-flight",
        choices=("wait", "reject"),
        default="wait",
        help="a duplicate of a running call without a SEP-3182 key: wait for it (default) "
        "or reject it",
    )
    parser.add_argument(
        "--no-implicit",
        action="store_true",
        help="deduplicate only calls that carry a key (no derived keys)",
    )
    parser.add_argument(
        "--tools", nargs="+", metavar="GLOB", help="tools that get derived keys (default: all)"
    )
    parser.add_argument(
        "--exclude-tools", nargs="+", metavar="GLOB", help="tools that never get derived keys"
    )
    parser.add_argument(
        "--dedupe-read-only",
        action="store_true",
        help="derive keys for tools annotated readOnlyHint too (default: they always run)",
    )
    _add_seconds(
        parser,
        "--cancel-grace",
        "cancel_grace",
        "a cancelled SEP-3182 call keeps its key this long without an answer",
    )
    parser.add_argument(
        "--on-takeover",
        choices=("run", "refuse"),
        default="run",
        help="a key taken over from a holder that died without an outcome: run the call "
        "again (default) or refuse it as outcome unknown",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="logs go to stderr (default warning)",
    )


# The defaults the duration flags show (and give), read from the dataclass: declared once.
_DEFAULTS = RelayOptions()


def _add_seconds(
    parser: argparse.ArgumentParser | Any, flag: str, field: str, what: str, *, given: bool = True
) -> None:
    """The flag of a ``RelayOptions`` duration: positive seconds, its default the field's."""
    default = getattr(_DEFAULTS, field)
    parser.add_argument(
        flag,
        type=positive_float,
        default=default if given else None,
        metavar="SECONDS",
        help=f"{what} (default {default:g})",
    )
