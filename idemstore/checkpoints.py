"""Recovery points as every store keeps them: their limits and their stored form.

A checkpoint (``idemstore.protocol.Checkpoint``) is a name and a little data appended to a key's
record by its owner (``Execution.checkpoint``, ``idemstore.execution.recovery_points``). Every
store checks it with ``check_checkpoint``, and a store that keeps bytes keeps the entries as
``encode_checkpoint`` writes them and ``decode_checkpoints`` reads them back.
"""

from __future__ import annotations

import struct

from idemstore.protocol import Checkpoint

__all__ = [
    "MAX_CHECKPOINTS",
    "MAX_CHECKPOINT_DATA",
    "MAX_CHECKPOINT_NAME",
    "check_checkpoint",
    "decode_checkpoints",
    "encode_checkpoint",
]

# Small enough that a record with all of them and a large response still fits one DynamoDB
# item (400 KB): 32 x (4 x 100 + 1024) bytes is under 46 KB.
MAX_CHECKPOINT_NAME = 100
"""Longest checkpoint name, in characters."""
MAX_CHECKPOINT_DATA = 1024
"""Largest ``data`` of one checkpoint, in bytes: a pointer to the step's result, not it."""
MAX_CHECKPOINTS = 32
"""Most checkpoints one key's record holds."""

# One entry: name length (2 bytes), data length (4 bytes), name (UTF-8), data. Entries are
# self-delimiting, so an engine appends one by concatenating bytes (SQL ``||``, a Lua string)
# and never has to parse what is stored.
_HEADER = struct.Struct(">HI")


def check_checkpoint(name: object, data: object) -> bytes:
    """``data`` as bytes, after checking ``name`` and ``data`` against the limits; raises
    ``TypeError``/``ValueError`` naming what is wrong."""
    if not isinstance(name, str):
        raise TypeError(f"checkpoint name must be a str, not {type(name).__name__}")
    if not name or len(name) > MAX_CHECKPOINT_NAME:
        raise ValueError(
            f"checkpoint name must be 1 to {MAX_CHECKPOINT_NAME} characters, not {len(name)}"
        )
    if "\x00" in name:
        raise ValueError("checkpoint name must not contain NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("checkpoint name must not contain lone surrogates") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"checkpoint data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_CHECKPOINT_DATA:
        raise ValueError(
            f"checkpoint data is {len(data)} bytes; at most {MAX_CHECKPOINT_DATA} are kept:"
            " record where the step's result is (an id), not the result"
        )
    return data


def encode_checkpoint(name: str, data: bytes) -> bytes:
    """The stored form of one checkpoint; a record's checkpoints are these, concatenated."""
    encoded = name.encode("utf-8")
    return _HEADER.pack(len(encoded), len(data)) + encoded + data


def decode_checkpoints(stored: bytes | None) -> tuple[Checkpoint, ...]:
    """The checkpoints of concatenated ``encode_checkpoint`` entries (``None``: none)."""
    if not stored:
        return ()
    view = memoryview(stored)
    found: list[Checkpoint] = []
    at = 0
    while at < len(view):
        name_length, data_length = _HEADER.unpack_from(view, at)
        at += _HEADER.size
        name = bytes(view[at : at + name_length]).decode("utf-8")
        at += name_length
        found.append(Checkpoint(name, bytes(view[at : at + data_length])))
        at += data_length
    return tuple(found)
