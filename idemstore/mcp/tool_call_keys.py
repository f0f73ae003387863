"""Which key a ``tools/call`` runs under, or why it runs under none: the relays' key derivation.

``KeyDeriver.prepare(message, line, key_scope=..., run_scope=...)`` classifies one client
``tools/call``: a ``ToolCall`` to run under a key, an ``Answer`` to give the client at once (an
invalid key), or a ``Forward`` to relay as it is. Keys, in this order:
``params.idempotencyKey`` (SEP-3182), ``params._meta["idempotency-key"]`` (mcp-idempotent's
explicit key), or one derived from the tool name and canonical arguments for tools the options
select (never for a tool the server lists ``readOnlyHint: true``, unless
``dedupe_read_only``). Explicit keys live in ``key_scope``, derived ones in ``run_scope``.

It holds no per-connection state: the stdio proxy has one per connection, the gateway one for
all requests (the read-only hints it learns from ``tools/list`` answers are shared).
Also here: the JSON-RPC wire helpers every relay uses (``dumps``, ``id_key``,
``error_line``).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemstore.errors import CanonicalizationError, IdemstoreError
from idemstore.hashing import fingerprint
from idemstore.mcp import sep3182
from idemstore.records import check_identity

if TYPE_CHECKING:
    from idemstore.mcp.outcome_policy import KeyKind
    from idemstore.mcp.relay_options import RelayOptions

__all__ = [
    "META_KEY_FIELD",
    "Answer",
    "Forward",
    "KeyDeriver",
    "ToolCall",
    "dumps",
    "error_line",
    "id_key",
]

logger = logging.getLogger("idemstore.mcp.tool_calls")

META_KEY_FIELD = "idempotency-key"
"""mcp-idempotent's explicit key: ``params._meta["idempotency-key"]``."""

_META_FIELD = f"_meta.{META_KEY_FIELD}"
_SELECTED_CACHE = 1024  # tool names whose selection by the globs is remembered

# Encoders made once: json.dumps with any option builds a new JSONEncoder on every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))
_SORTED = json.JSONEncoder(sort_keys=True)
_STRICT = json.JSONEncoder(allow_nan=False)


def dumps(value: object) -> bytes:
    """Compact JSON bytes (UTF-8; a lone surrogate stays escaped)."""
    try:
        return _COMPACT.encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(value).encode("ascii")


def id_key(request_id: object) -> str:
    """A hashable identity for a JSON-RPC id (``1`` and ``"1"`` differ)."""
    if type(request_id) is int:
        return int.__repr__(request_id)  # what json.dumps writes for an int
    return _SORTED.encode(request_id)


def error_line(request_id: object, error: dict[str, Any]) -> bytes:
    """A JSON-RPC error response line for ``request_id``."""
    return dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + b"\n"


def _writable_id(request_id: object) -> bool:
    try:
        if type(request_id) is int:
            int.__repr__(request_id)  # what json writes; only too many digits fail
        elif type(request_id) is not str:  # a str is always writable (escaped as needed)
            _STRICT.encode(request_id)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An intercepted ``tools/call``: what a relay runs under its key."""

    request_id: object
    id_key: str
    kind: KeyKind
    key: str
    scope: str
    fingerprint: str
    name: str
    forward: bytes  # the bytes the server gets


@dataclass(frozen=True, slots=True)
class Answer:
    """``prepare``'s verdict: answer the client with ``line`` at once; the server gets nothing."""

    line: bytes


@dataclass(frozen=True, slots=True)
class Forward:
    """``prepare``'s verdict: relay ``line`` to the server without a key (nothing to run)."""

    line: bytes


class KeyDeriver:
    """Key derivation under ``options``, and the ``readOnlyHint`` annotations read so far."""

    __slots__ = ("_options", "_read_only", "_selected")

    def __init__(self, options: RelayOptions) -> None:
        self._options = options
        self._read_only: dict[str, bool] = {}
        self._selected: dict[str, bool] = {}  # _select's answers by tool name

    def is_read_only(self, name: str) -> bool:
        """Whether the server's ``tools/list`` said ``readOnlyHint: true`` for tool ``name``."""
        return self._read_only.get(name, False)

    def read_annotations(self, result: dict[str, Any]) -> None:
        """Learn the ``readOnlyHint`` of every tool in a ``tools/list`` result."""
        listed = result.get("tools")
        if not isinstance(listed, list):
            return
        for tool in listed:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            annotations = tool.get("annotations")
            hint = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
            self._read_only[tool["name"]] = hint

    def _derives_key(self, name: str) -> bool:
        selected = self._selected.get(name)
        if selected is None:
            selected = self._select(name)
            if len(self._selected) >= _SELECTED_CACHE:
                self._selected.clear()  # bounded: clients name tools at will
            self._selected[name] = selected
        # Not cached: the read-only hints change as tools/list answers are read.
        return selected and (self._options.dedupe_read_only or not self.is_read_only(name))

    def _select(self, name: str) -> bool:
        """Whether the options pick tool ``name`` for derived keys (the globs: fixed)."""
        options = self._options
        if not options.implicit:
            return False
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in options.tools):
            return False
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in options.exclude_tools)

    def prepare(
        self, message: dict[str, Any], line: bytes, *, key_scope: str, run_scope: str
    ) -> ToolCall | Answer | Forward:
        """Classify a client ``tools/call``: run it, ``Answer`` it, or ``Forward`` it as is.

        A ``Forward`` carries the client's own bytes, except that a ``null`` SEP key is dropped
        (read as absent, and a strict server rejects params it does not know).
        """
        params = message.get("params")
        request_id = message.get("id")
        if request_id is None or not isinstance(params, dict):
            return Forward(line)
        name = params.get("name")
        if not isinstance(name, str) or sep3182.is_continuation(params):
            return Forward(line)  # malformed (the server answers it) or an MRTR continuation
        forward = line
        if sep3182.KEY_FIELD in params:
            # The server does not know the field (null included): strip it before forwarding.
            stripped = {k: v for k, v in params.items() if k != sep3182.KEY_FIELD}
            forward = dumps({**message, "params": stripped}) + b"\n"
        kind: KeyKind
        key: object
        meta = params.get("_meta")
        sep_key = sep3182.key_of(params)  # null reads as absent
        if sep_key is not None:
            kind, key = "sep", sep_key
        elif isinstance(meta, dict) and meta.get(META_KEY_FIELD) is not None:
            kind, key = "meta", meta[META_KEY_FIELD]
        elif self._derives_key(name):
            kind, key = "derived", ""
        else:
            return Forward(forward)
        if not _writable_id(request_id):
            # NaN or Infinity: no JSON answer can carry this id; answer as for an unreadable id.
            why = "the request id is not a JSON value (NaN or Infinity)"
            return Answer(error_line(None, sep3182.error(sep3182.INVALID_REQUEST, why)))
        return self._keyed(request_id, name, params, kind, key, forward, key_scope, run_scope)

    def _keyed(
        self,
        request_id: object,
        name: str,
        params: dict[str, Any],
        kind: KeyKind,
        key: object,
        forward: bytes,
        key_scope: str,
        run_scope: str,
    ) -> ToolCall | Answer | Forward:
        field_name = sep3182.KEY_FIELD if kind == "sep" else _META_FIELD if kind == "meta" else None
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            if kind == "derived":
                return Forward(forward)  # the server answers it as it would without the relay
            why = "arguments must be an object"
            return Answer(error_line(request_id, sep3182.invalid_key_error(key, why, "arguments")))
        if not isinstance(key, str):
            why = "the key must be a string"
            error = sep3182.invalid_key_error(key, why, str(field_name))
            return Answer(error_line(request_id, error))
        try:
            print_ = fingerprint({"name": name, "arguments": arguments})
        except CanonicalizationError as exc:
            if kind == "derived":
                logger.warning("call of %r relayed without a key: %s", name, exc)
                return Forward(forward)
            why = f"arguments are not JSON: {exc}"
            return Answer(error_line(request_id, sep3182.invalid_key_error(key, why, "arguments")))
        if kind == "derived":
            key, scope = f"{name}:{print_}", run_scope
            try:
                check_identity(key, scope)
            except IdemstoreError:
                key = f"sha256:{print_}"  # a tool name too long (or odd) for a key
        else:
            scope = key_scope
            try:
                check_identity(key, scope)
            except IdemstoreError as exc:
                error = sep3182.invalid_key_error(key, str(exc), str(field_name))
                return Answer(error_line(request_id, error))
        return ToolCall(request_id, id_key(request_id), kind, key, scope, print_, name, forward)
