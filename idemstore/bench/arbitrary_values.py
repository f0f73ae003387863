"""Arbitrary JSON values, seeded: what the hasher is measured and checked on besides the
realistic shapes of ``hasher_scenario``.

Each builder takes a size in bytes of JSON and a seed and returns the same value for the
same pair. The values cover what a caller may send rather than what one usually does:

- doubles of full precision (53 random mantissa bits) at every exponent, from the subnormals
  to the largest double, half of them in the decimal range where the ECMAScript layout
  changes (1e-10 to 1e22), with integral doubles, signed zeros and powers of ten;
- strings of any code point: controls, ``"`` and ``\\``, U+2028 and U+2029, the BMP beside
  and past the surrogates (lone surrogates are not Unicode, so none), code points past U+FFFF,
  and runs of one character or chunk repeated;
- objects whose keys come in a random order and mix the planes whose code-point order and
  UTF-16 order disagree, nested at random depth with every JSON type.

The differential test (``tests/test_hashing.py``) and the ``hasher`` bench scenario both use
these builders, so the values timed are values checked byte for byte against ``rfc8785``.
"""

from __future__ import annotations

import json
import math
import random
import struct
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "ARBITRARY_SHAPES",
    "ValueBuilder",
    "arbitrary_double",
    "arbitrary_floats",
    "arbitrary_mix",
    "arbitrary_string",
    "arbitrary_strings",
]

# Largest integer JSON carries exactly (RFC 8785 refuses larger ints; rfc8785 too).
_SAFE_INT = 2**53 - 1
_UNPACK_DOUBLE = struct.Struct("<d").unpack
_PACK_BITS = struct.Struct("<Q").pack

# Code point ranges a string character is drawn from, with their weights: each range is where
# an encoder branches (escapes, the two separators JavaScript once could not hold, the
# surrogate gap, the code points whose UTF-16 order differs from their code-point order).
_CHARACTER_RANGES: tuple[tuple[int, int, int], ...] = (
    (0x20, 0x7E, 30),  # printable ASCII
    (0x00, 0x1F, 4),  # controls: escaped, five of them by name
    (0x22, 0x22, 2),  # '"'
    (0x5C, 0x5C, 2),  # '\'
    (0x7F, 0x7FF, 12),  # DEL, Latin, Greek, Cyrillic, Hebrew, Arabic: two UTF-8 bytes
    (0x2028, 0x2029, 2),  # line and paragraph separators: not escaped by JCS
    (0x800, 0xD7FF, 16),  # the BMP below the surrogates: CJK and the rest
    (0xE000, 0xFFFF, 8),  # past the surrogates: sorts after astral code points in UTF-16
    (0x10000, 0x10FFFF, 24),  # astral: emoji, math letters, unassigned planes
)
_RANGE_WEIGHTS = [weight for _, _, weight in _CHARACTER_RANGES]


class ValueBuilder(Protocol):
    """Builds a value of about ``size`` bytes of JSON, the same for the same seed."""

    def __call__(self, size: int, seed: int = 0, /) -> dict[str, Any]: ...


def arbitrary_double(rng: random.Random) -> float:
    """A finite double: full precision at any exponent, or at one where the layout changes."""
    pick = rng.random()
    if pick < 0.45:
        # Any finite bit pattern: every binary exponent alike, subnormals included.
        while True:
            value: float = _UNPACK_DOUBLE(_PACK_BITS(rng.getrandbits(64)))[0]
            if math.isfinite(value):
                return value
    if pick < 0.9:
        # 53 random bits of mantissa at a decimal exponent from 1e-10 to 1e22.
        mantissa = 1.0 + rng.getrandbits(52) / 2.0**52
        value = mantissa * 10.0 ** rng.randint(-10, 22)
    elif pick < 0.96:
        value = float(rng.randint(-(10**22), 10**22) >> rng.randrange(0, 74))
    else:
        value = rng.choice((0.0, 1.0, 0.5, 1e21, 1e-7, 1e-6, 1e16, 2.0**53, 5e-324))
    return -value if rng.random() < 0.5 else value


def arbitrary_string(rng: random.Random, length: int) -> str:
    """``length`` code points or so, from every range, sometimes in repeated runs."""
    chars: list[str] = []
    while len(chars) < length:
        low, high, _ = rng.choices(_CHARACTER_RANGES, _RANGE_WEIGHTS)[0]
        character = chr(rng.randint(low, high))
        if rng.random() < 0.05:
            # A run: one character, or the last few characters, several times over.
            chunk = chars[-rng.randint(1, 8) :] if chars and rng.random() < 0.5 else [character]
            chars.extend(chunk * rng.randint(2, 12))
        else:
            chars.append(character)
    return "".join(chars[: max(length, 0)])


def _key(rng: random.Random) -> str:
    # Short keys make collisions between near keys, where the sort order is decided by the
    # first differing code unit.
    return arbitrary_string(rng, rng.choice((1, 2, 3, 5, 8, 13)))


def _scalar(rng: random.Random, floats: float, strings: float) -> Any:
    pick = rng.random()
    if pick < floats:
        return arbitrary_double(rng)
    if pick < floats + strings:
        return arbitrary_string(rng, rng.choice((0, 1, 4, 12, 40, 120)))
    other = rng.random()
    if other < 0.5:
        return rng.randint(-_SAFE_INT, _SAFE_INT) >> rng.randrange(0, 53)
    if other < 0.8:
        return rng.random() < 0.5
    return None


def _object(rng: random.Random, count: int, item: Callable[[], Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    while len(obj) < count:
        obj[_key(rng)] = item()
    return obj  # keys in the random order they were drawn in


def _nested(rng: random.Random, depth: int, floats: float, strings: float) -> Any:
    """A random tree: containers become rarer with depth, leaves are scalars."""
    if depth >= 6 or rng.random() < 0.35 + 0.1 * depth:
        return _scalar(rng, floats, strings)
    count = rng.choice((0, 1, 2, 3, 5, 8))

    def child() -> Any:
        return _nested(rng, depth + 1, floats, strings)

    if rng.random() < 0.5:
        return [child() for _ in range(count)]
    return _object(rng, count, child)


def _grow(size: int, seed: int, part: Callable[[random.Random], Any]) -> dict[str, Any]:
    """An object of random keys whose values come from ``part`` until its JSON is ``size``
    bytes (UTF-8, unescaped) or more."""
    rng = random.Random(seed)
    value: dict[str, Any] = {}
    written = 2
    while written < size:
        key, item = _key(rng), part(rng)
        if key in value:
            continue
        value[key] = item
        written += len(json.dumps({key: item}, ensure_ascii=False).encode()) - 1
    return value


def arbitrary_floats(size: int, seed: int = 0) -> dict[str, Any]:
    """Float-heavy JSON of about ``size`` bytes: arrays and objects of arbitrary doubles."""

    def part(rng: random.Random) -> Any:
        if rng.random() < 0.5:
            return [arbitrary_double(rng) for _ in range(rng.randint(1, 16))]
        return _object(rng, rng.randint(1, 8), lambda: arbitrary_double(rng))

    return _grow(size, seed, part)


def arbitrary_strings(size: int, seed: int = 0) -> dict[str, Any]:
    """String-heavy JSON of about ``size`` bytes: arbitrary strings under arbitrary keys."""

    def part(rng: random.Random) -> Any:
        if rng.random() < 0.5:
            return arbitrary_string(rng, rng.choice((1, 8, 30, 80, 200)))
        return [arbitrary_string(rng, rng.choice((1, 8, 30))) for _ in range(rng.randint(1, 6))]

    return _grow(size, seed, part)


def arbitrary_mix(size: int, seed: int = 0) -> dict[str, Any]:
    """JSON of about ``size`` bytes nesting every type: objects and arrays at random depths
    holding doubles, strings, integers, booleans and nulls."""
    return _grow(size, seed, lambda rng: _nested(rng, 0, 0.35, 0.35))


# The generated shapes the bench times beside its realistic ones, under the names it reports.
ARBITRARY_SHAPES: dict[str, ValueBuilder] = {
    "any-float": arbitrary_floats,
    "any-string": arbitrary_strings,
    "any-mix": arbitrary_mix,
}
