"""canonical_json / fingerprint: RFC 8785 output, the documented integer extension, errors."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import threading
import unicodedata
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

import idemstore.hashing
from idemstore.bench.arbitrary_values import (
    ARBITRARY_SHAPES,
    arbitrary_double,
    arbitrary_mix,
    arbitrary_string,
)
from idemstore.bench.hasher_scenario import SHAPES
from idemstore.errors import CanonicalizationError
from idemstore.hashing import canonical_json, fingerprint

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(autouse=True, scope="module", params=["compiled pass", "pure-Python pass"])
def hashing_pass(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this file runs through each pass of ``idemstore.hashing``: the compiled
    one (``idemstore/_canonical.c``, handing what it does not take to the Python one) and the
    Python one alone. Module-scoped: hypothesis refuses function-scoped fixtures."""
    compiled = idemstore.hashing._compiled
    if request.param == "compiled pass" and compiled is None:
        if os.environ.get("IDEMSTORE_TEST_REQUIRE_ALL"):
            pytest.fail("the compiled pass was not built: is a C compiler installed?")
        pytest.skip("the compiled pass was not built (no C compiler at install)")
    if request.param == "pure-Python pass":
        idemstore.hashing._compiled = None
    try:
        yield request.param
    finally:
        idemstore.hashing._compiled = compiled


JCS_DIR = Path(__file__).parent / "data" / "jcs"
VECTOR_NAMES = sorted(path.name for path in (JCS_DIR / "input").glob("*.json"))

SAFE_INT = 2**53 - 1

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


# Characters where the fast path branches: the escaped controls, '"' and '\\', U+007F and
# U+2028 (which JCS does not escape), and both sides of the place where code-point order and
# UTF-16 order disagree (U+E000-U+FFFF against characters past U+FFFF).
EDGE_CHARACTERS = st.sampled_from(
    ["\x00", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1f", '"', "\\", "/", "\x7f",
     "a", "é", "\u2028", "\u2029", "\ud7ff", "\ue000", "\ufeff", "\uffff", "\U00010000",
     "\U0001f600", "\U0010ffff"]
)  # fmt: skip
# codec="utf-8" leaves out lone surrogates, which are not Unicode (and are refused).
edge_text = st.text(EDGE_CHARACTERS | st.characters(codec="utf-8"), max_size=8)


def _near(value: float) -> list[float]:
    return [math.nextafter(value, -math.inf), value, math.nextafter(value, math.inf)]


# Doubles around every boundary of the ECMAScript layout and of the encoder's repr: 1e-7 and
# 1e-6 (exponent or not), 1e-4 (repr's plain range), 1e16 and 2**53 (integral, repr's exponent
# form), 1e21 (ECMAScript's exponent form), the subnormals and the largest double.
EDGE_FLOATS = sorted(
    {
        sign * x
        for base in (
            1e-10,
            1e-9,
            1e-7,
            1e-6,
            1e-5,
            1e-4,
            1.0,
            1e15,
            2.0**53,
            1e16,
            1e20,
            1e21,
            1e22,
        )
        for x in _near(base)
        for sign in (1, -1)
    }
    | {0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.5, 24.0}
)
# Doubles of every decimal magnitude alike, from the subnormals to the largest, and integral
# doubles up to 1e22 (exact below 2**53, padded with zeros by ECMAScript past it): uniform
# doubles would almost all be huge or tiny, missing the layouts in between.
magnitude_floats = st.builds(
    lambda mantissa, exponent, negative: (
        (-1 if negative else 1) * float(f"{mantissa!r}e{exponent}")
    ),
    st.floats(min_value=1.0, max_value=10.0, exclude_max=True),
    st.integers(min_value=-324, max_value=308),
    st.booleans(),
).filter(math.isfinite) | st.integers(min_value=-(10**22), max_value=10**22).map(float)
edge_floats = (
    st.sampled_from(EDGE_FLOATS)
    | magnitude_floats
    | st.floats(allow_nan=False, allow_infinity=False)
)
edge_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | st.sampled_from([SAFE_INT, -SAFE_INT, 2**31, 10**15])
    | edge_floats
    | edge_text
)
edge_values = st.recursive(
    edge_scalars,
    lambda children: (
        st.lists(children, max_size=6)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(edge_text, children, max_size=6)
    ),
    max_leaves=60,
)


class Wrapped:
    """A non-JSON object that default= turns into the JSON value it carries."""

    def __init__(self, value: Any) -> None:
        self.value = value


def unwrap(value: Any) -> Any:
    """The value with every Wrapped replaced by what it carries (what default= yields)."""
    if isinstance(value, Wrapped):
        return unwrap(value.value)
    if isinstance(value, dict):
        return {key: unwrap(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [unwrap(item) for item in value]
    return value


wrapped_values = st.recursive(
    edge_scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(edge_text, children, max_size=5)
        | children.map(Wrapped)
    ),
    max_leaves=30,
)


def loads_fingerprint(text: str) -> str:
    return fingerprint(json.loads(text))


# --- RFC 8785 conformance -------------------------------------------------------------


def test_every_test_vector_is_present() -> None:
    assert VECTOR_NAMES == [
        "arrays.json",
        "french.json",
        "structures.json",
        "unicode.json",
        "values.json",
        "weird.json",
    ]
    assert sorted(path.name for path in (JCS_DIR / "output").glob("*.json")) == VECTOR_NAMES


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_test_vector_reproduces_byte_for_byte(name: str) -> None:
    value = json.loads((JCS_DIR / "input" / name).read_bytes())
    # The output files hold exactly the canonical bytes, with no trailing newline.
    expected = (JCS_DIR / "output" / name).read_bytes()

    assert canonical_json(value) == expected


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_output_is_identical_to_rfc8785_over_its_domain(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=500, deadline=None)
@given(edge_values)
def test_output_is_identical_to_rfc8785_on_edge_keys_strings_and_numbers(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(edge_text, edge_scalars, min_size=2, max_size=12))
def test_object_keys_sort_like_rfc8785_whatever_their_planes(value: dict[str, Any]) -> None:
    assert canonical_json({"outer": [value, {"x": value}]}) == rfc8785.dumps(
        {"outer": [value, {"x": value}]}
    )


@settings(max_examples=200, deadline=None)
@given(wrapped_values)
def test_default_results_are_canonicalized_like_the_values_they_stand_for(value: Any) -> None:
    converted = canonical_json(value, default=lambda wrapped: wrapped.value)

    assert converted == rfc8785.dumps(unwrap(value))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=100, max_value=400), edge_scalars)
def test_deep_nesting_is_identical_to_rfc8785(depth: int, leaf: Any) -> None:
    value: Any = leaf
    for level in range(depth):
        value = [value, 1.0] if level % 2 else {"k\U0001f600": value, "\uffff": 1e-7}

    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        lambda mantissa, exponent: mantissa * 2**exponent,
        st.integers(min_value=-(2**53), max_value=2**53).filter(lambda m: m % 2),
        st.integers(min_value=1, max_value=970),
    )
)
def test_integer_a_double_holds_is_written_as_rfc8785_writes_that_double(n: int) -> None:
    # rfc8785 refuses integers past 2**53; the extension writes these as their doubles.
    assert canonical_json([n, {"n": n}]) == rfc8785.dumps([float(n), {"n": float(n)}])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_realistic_tool_call_of_every_bench_shape_is_identical_to_rfc8785(shape: str) -> None:
    # The bench's values at 13 KB: non-ASCII text, emoji keys (some reordered for UTF-16),
    # floats of every layout.
    value = SHAPES[shape](13_000)

    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=1000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_is_written_like_rfc8785(value: float) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e21, b"1e+21"),
        (1e20, b"100000000000000000000"),
        (1e16, b"10000000000000000"),
        (123456789012345680000.0, b"123456789012345680000"),
        (1e-6, b"0.000001"),
        (1e-7, b"1e-7"),
        (1.5e-7, b"1.5e-7"),
        (-1.5e-7, b"-1.5e-7"),
        (0.000123, b"0.000123"),
        (2.5, b"2.5"),
        (-0.0, b"0"),
        (5e-324, b"5e-324"),
        (1.7976931348623157e308, b"1.7976931348623157e+308"),
    ],
)
def test_floats_use_ecmascript_number_layout(value: float, expected: bytes) -> None:
    assert canonical_json(value) == expected


def test_strings_escape_only_quote_backslash_and_control_characters() -> None:
    text = '"\\\x00\x08\t\n\x0c\r\x1f\x7f/\u2028é😀'

    assert canonical_json(text) == ('"\\"\\\\\\u0000\\b\\t\\n\\f\\r\\u001f\x7f/\u2028é😀"'.encode())


@pytest.mark.parametrize("code", range(0x20))
def test_every_control_character_is_escaped_as_rfc8785_says(code: int) -> None:
    named = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
    expected = named.get(code, f"\\u{code:04x}")

    assert canonical_json(chr(code)) == f'"{expected}"'.encode()
    assert canonical_json({chr(code): 0}) == f'{{"{expected}":0}}'.encode()


def test_non_ascii_beyond_the_controls_is_written_as_utf8_unescaped() -> None:
    text = "\x7f\x80\xa0\u2028\u2029\ufeff\uffff\U0010ffff"

    assert canonical_json([text]) == f'["{text}"]'.encode()


def test_literals_are_written_as_json_literals() -> None:
    assert canonical_json([None, True, False]) == b"[null,true,false]"


def test_tuples_are_written_as_arrays() -> None:
    assert canonical_json({"t": (1, "a", ())}) == b'{"t":[1,"a",[]]}'


def test_subclasses_of_json_types_are_written_as_their_base_type() -> None:
    class Color(IntEnum):
        RED = 3

    class Mode(StrEnum):
        FAST = "fast"

    class Ordered(dict[str, Any]):
        pass

    value = [Color.RED, Mode.FAST, Ordered(b=1, a=2)]

    assert canonical_json(value) == b'[3,"fast",{"a":2,"b":1}]'


def test_moderately_deep_nesting_is_accepted() -> None:
    value: Any = "leaf"
    for _ in range(200):
        value = {"n": [value]}

    assert canonical_json(value) == b'{"n":[' * 200 + b'"leaf"' + b"]}" * 200


# --- Equivalences a retried request relies on ------------------------------------------


def test_integer_and_integral_float_fingerprint_alike() -> None:
    assert loads_fingerprint('{"n": 1}') == loads_fingerprint('{"n": 1.0}')
    assert canonical_json(1) == canonical_json(1.0) == b"1"


def test_negative_zero_fingerprints_like_zero() -> None:
    assert loads_fingerprint("[-0.0]") == loads_fingerprint("[0]")


def test_key_order_does_not_matter() -> None:
    assert loads_fingerprint('{"a": 1, "b": {"x": 1, "y": 2}}') == loads_fingerprint(
        '{"b": {"y": 2, "x": 1}, "a": 1}'
    )


@pytest.mark.parametrize(
    ("escaped", "literal"),
    [
        ('"caf\\u00e9"', '"café"'),
        ('"\\u002f\\/"', '"//"'),
        ('"\\ud83d\\ude00"', '"😀"'),
        ('{"\\u00e9": "\\u0041"}', '{"é": "A"}'),
    ],
)
def test_escaped_and_literal_characters_fingerprint_alike(escaped: str, literal: str) -> None:
    assert loads_fingerprint(escaped) == loads_fingerprint(literal)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(magnitude_floats, max_size=20), st.dictionaries(st.text(max_size=2), magnitude_floats)
)
def test_floats_of_every_magnitude_are_written_like_rfc8785(
    items: list[float], obj: dict[str, float]
) -> None:
    assert canonical_json([items, obj]) == rfc8785.dumps([items, obj])


# Few characters, so keys often first differ at a character from each range whose order
# differs between code points and UTF-16 code units (U+E000-U+FFFF against past U+FFFF).
PLANE_KEYS = st.text(
    st.sampled_from(
        ["a", "é", "中", "\ue000", "\uff01", "\uffff", "\U00010000", "😀", "\U0001d49c"]
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(PLANE_KEYS, edge_scalars | st.dictionaries(PLANE_KEYS, edge_scalars)))
def test_keys_from_every_plane_sort_like_rfc8785(value: dict[str, Any]) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


def test_keys_sort_by_utf16_code_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16, which sorts before U+FFFF even
    # though its code point is larger.
    value = {"\uffff": 1, "\U0001f600": 2, "a": 3}

    assert canonical_json(value) == '{"a":3,"😀":2,"\uffff":1}'.encode()
    assert canonical_json(value) == rfc8785.dumps(value)


def test_whitespace_in_the_source_json_does_not_matter() -> None:
    compact = '{"a":[1,2,{"b":null}],"c":"d e"}'
    spaced = '\n {\t"a" : [ 1 ,\r\n 2 , { "b" : null } ] ,\n "c" : "d e" }\n'

    assert loads_fingerprint(compact) == loads_fingerprint(spaced)


def test_unicode_is_not_normalized() -> None:
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")

    assert nfc != nfd
    assert fingerprint(nfc) != fingerprint(nfd)
    assert canonical_json(nfd) == f'"{nfd}"'.encode()


# --- Integers beyond 2**53 (the documented extension) ----------------------------------


def test_integer_a_double_holds_exactly_is_written_as_that_double() -> None:
    assert canonical_json(10**21) == canonical_json(1e21) == b"1e+21"


def test_even_integer_past_2_pow_53_equals_its_double() -> None:
    assert canonical_json(2**53 + 2) == canonical_json(float(2**53 + 2))


def test_integer_no_double_holds_keeps_its_exact_digits() -> None:
    assert canonical_json(2**53 + 1) == b"9007199254740993"
    assert canonical_json(-(2**53) - 1) == b"-9007199254740993"
    assert fingerprint(2**53 + 1) != fingerprint(float(2**53 + 1))


def test_integer_whose_digits_match_a_padded_double_still_hashes_apart() -> None:
    # The double 2**60 is written 1152921504606847000 (shortest digits, zero-padded), which
    # are also the exact digits of this different integer.
    other = 1152921504606847000
    assert other != 2**60
    assert canonical_json(2**60) == b"1152921504606847000"
    assert canonical_json(other) == b"1.152921504606847e+18"
    assert fingerprint(other) != fingerprint(2**60)
    assert canonical_json(-other) == b"-1.152921504606847e+18"


@given(st.integers(min_value=2**53, max_value=10**22))
def test_integers_hash_equal_exactly_when_equal(n: int) -> None:
    assert (canonical_json(n) == canonical_json(n + 1)) is False
    assert canonical_json(n) == canonical_json(float(n)) or int(float(n)) != n


def test_400_digit_integer_is_written_as_its_digits() -> None:
    big = int("7" * 400)

    assert canonical_json(big) == b"7" * 400


def test_integer_too_long_for_decimal_conversion_raises_with_its_path() -> None:
    # Past sys.get_int_max_str_digits() (4300 by default), str(int) itself refuses.
    with pytest.raises(CanonicalizationError, match="digits") as caught:
        canonical_json({"n": [10**5000 + 1]})

    assert caught.value.path == "/n/0"


# --- Errors ------------------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"args": {"items": [1, 2, 3, float("nan")]}}, "/args/items/3"),
        ({"limits": [float("inf")]}, "/limits/0"),
        ([{"low": float("-inf")}], "/0/low"),
        ({"tags": {"a", "b"}}, "/tags"),
        ({"blob": [b"\x00"]}, "/blob/0"),
        ({"x": {"y": Opaque()}}, "/x/y"),
        ({"a/b": {"c~d": float("nan")}}, "/a~1b/c~0d"),
        (float("nan"), ""),
    ],
)
def test_non_json_value_raises_with_its_path(value: Any, path: str) -> None:
    with pytest.raises(CanonicalizationError) as caught:
        canonical_json(value)

    assert caught.value.path == path
    assert str(caught.value).endswith(f" at {path or '/'}")


def test_non_str_key_raises_with_its_path() -> None:
    with pytest.raises(CanonicalizationError, match="key 1 ") as caught:
        canonical_json({"a": [{"ok": 1, 1: "one"}]})

    assert caught.value.path == "/a/0/1"


def test_lone_surrogate_in_a_string_raises_with_its_path() -> None:
    with pytest.raises(CanonicalizationError, match="surrogate") as caught:
        canonical_json({"a": ["fine", "bad\ud800"]})

    assert caught.value.path == "/a/1"


def test_lone_surrogate_in_a_key_raises_with_its_path() -> None:
    with pytest.raises(CanonicalizationError, match="surrogate") as caught:
        canonical_json({"a": {"é": 1, "k\udc00": 2}})

    # Escaped, so the message stays printable.
    assert caught.value.path == "/a/k\\udc00"


def test_lone_surrogate_in_a_key_beside_a_non_bmp_key_raises_with_its_path() -> None:
    # Such an object is sorted by UTF-16 code units, which a lone surrogate has none of.
    with pytest.raises(CanonicalizationError, match="surrogate") as caught:
        canonical_json({"a": {"\U0001f600": 1, "k\ud800": 2}})

    assert caught.value.path == "/a/k\\ud800"


def test_lone_surrogate_in_a_key_of_an_object_reordered_for_utf16_raises_with_its_path() -> None:
    # Keys past U+FFFF beside keys in U+E000-U+FFFF are reordered before encoding.
    with pytest.raises(CanonicalizationError, match="surrogate") as caught:
        canonical_json({"a": {"\U0001f600": 1, "\uffff": 2, "k\ud800": 3}})

    assert caught.value.path == "/a/k\\ud800"


def test_string_holding_the_placeholder_mark_raises_instead_of_corrupting_numbers() -> None:
    # 1e-7 reaches the encoder as a marked placeholder; a caller's string holding the same
    # (lone surrogate) mark must be refused, not unquoted along with it.
    mark = "\udfff"
    value = {"a": 1e-7, "b": [mark + "5" + mark], "c": mark}

    with pytest.raises(CanonicalizationError, match="surrogate") as caught:
        canonical_json(value)

    assert caught.value.path == "/b/0"


MARK = "\x1f\x1e\x1d"


@pytest.mark.parametrize(
    "text",
    ["\x1f", "\\u001f", MARK, "\\u001f\\u001e\\u001d", f'"{MARK}5{MARK}"', f"{MARK}1e-7{MARK}",
     "\\u001f\x1e\x1d", "\x1f\x1e", MARK * 3],
)  # fmt: skip
def test_string_holding_the_mark_or_its_escape_is_written_like_rfc8785(text: str) -> None:
    # 1e-7 reaches the encoder between two marks (three controls), which the encoder writes
    # escaped; a caller's string may hold the same, or part of it, and must come out as itself.
    value = {"a": 1e-7, "b": [text, 2.5e-8], text: text}

    assert canonical_json(value) == rfc8785.dumps(value)


# Placeholders are unmarked by removing '"' MARK and MARK '"' and checking how much the text
# shrank: a caller's string that adds, or sits against, one of those must still come out as
# itself. Strings and keys that read like the number tokens rewritten nearby, with escapes
# before them, must too.
LOOKALIKES = [
    MARK + '"', '"' + MARK, "\\" + MARK, MARK + "\\", MARK + "1e-7", "1e-7" + MARK,
    "\\u001f\\u001e\\u001d\"", "1e-07", "1e-7", "1.0", "-0.0", "1e+16", "1.5e-05",
    "0.000015", ',1e-07,', '":1e-07}', '\\"1e-07', '\\\\1.0]', "100000000000000000",
]  # fmt: skip


@pytest.mark.parametrize("text", LOOKALIKES)
def test_string_that_looks_like_a_rewritten_number_or_a_mark_is_written_like_rfc8785(
    text: str,
) -> None:
    value = {
        text: [1e-7, text, 1.5e-5, 1e16, -0.0, 1.0],
        "k": {text: 2.5e-8, "x": [text, 1.2345e17]},
        "n": 3e-9,
    }

    assert canonical_json(value) == rfc8785.dumps(value)


ODD_EXPONENTS = [-9, -8, -7, -6, -5, 16, 17, 18, 19, 20]


@settings(max_examples=500, deadline=None)
@given(
    st.floats(min_value=1.0, max_value=10.0, exclude_max=True),
    st.sampled_from(ODD_EXPONENTS),
    st.booleans(),
)
def test_doubles_where_repr_and_ecmascript_lay_out_differently_are_written_like_rfc8785(
    mantissa: float, exponent: int, negative: bool
) -> None:
    # The ranges the pass rewrites from a table of repr's exponent, every exponent of them,
    # with short and full-precision digits, in objects and arrays.
    value = (-1 if negative else 1) * mantissa * 10.0**exponent
    short = float(f"{'-' if negative else ''}{round(mantissa, 2)}e{exponent}")

    assert canonical_json([value, {"v": short}]) == rfc8785.dumps([value, {"v": short}])


@pytest.mark.parametrize("exponent", [*ODD_EXPONENTS, -4, 21])
def test_doubles_next_to_each_layout_boundary_are_written_like_rfc8785(exponent: int) -> None:
    values = [sign * x for x in _near(10.0**exponent) for sign in (1, -1)]
    # Keys that are the reprs of the values beside them.
    value = [values, {repr(x): x for x in values}]

    assert canonical_json(value) == rfc8785.dumps(value)


def test_canonicalizing_leaves_the_value_unchanged() -> None:
    # Integral and tiny floats, big integers, subclasses and non-BMP keys are all rewritten
    # on the way to the encoder: in copies.
    class Ordered(dict[str, Any]):
        pass

    value: dict[str, Any] = {
        "floats": [1.0, 1e-7, -0.0, 1e16, (2.0,)],
        "ints": [2**60, 2**53 + 1, 10**21],
        "keys": {"\U0001f600": {"x": 3.0}, "\uffff": Ordered(b=1.0)},
    }
    before = copy.deepcopy(value)

    canonical_json(value)

    assert value == before
    assert repr(value) == repr(before)  # 1.0 is still a float, not the int 1


def test_encoder_without_the_c_accelerator_writes_the_same_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = {"b": [1, 2.5, "é\n", None, True], "a": {"\U0001f600": 1}}
    fast = idemstore.hashing._one_call_encoder()
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    plain = idemstore.hashing._one_call_encoder()

    assert plain == idemstore.hashing._ENCODER.encode
    assert plain(value) == fast(value)


def test_pure_python_encoder_keeps_objects_in_utf16_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    monkeypatch.setattr(idemstore.hashing, "_encode", idemstore.hashing._one_call_encoder())
    value = {"b": {"\uffff": 1, "\U0001f600": [2.0, 1e-7], "a": 3, "\ue000x": {"z": 1, "y": 2}}}

    assert canonical_json(value) == rfc8785.dumps(value)


def test_reference_cycle_raises_instead_of_recursing_forever() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = [cyclic]

    with pytest.raises(CanonicalizationError, match="cycle") as caught:
        canonical_json(cyclic)

    assert re.fullmatch(r"(/self/0)+(/self)?", caught.value.path)


def test_nesting_over_1000_levels_raises_canonicalization_error() -> None:
    value: Any = []
    for _ in range(1001):
        value = [value]

    with pytest.raises(CanonicalizationError, match="too deeply"):
        canonical_json(value)


def test_default_converts_an_unknown_object() -> None:
    value = {"when": Opaque(), "n": 1}

    assert canonical_json(value, default=lambda o: {"opaque": True}) == (
        b'{"n":1,"when":{"opaque":true}}'
    )


def test_default_result_that_is_not_json_raises_with_the_objects_path() -> None:
    with pytest.raises(CanonicalizationError) as caught:
        canonical_json({"when": Opaque()}, default=lambda o: {"v": float("nan")})

    assert caught.value.path == "/when/v"


def test_default_returning_its_argument_raises_instead_of_looping() -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json([Opaque()], default=lambda o: o)


# --- fingerprint -----------------------------------------------------------------------


def test_fingerprint_is_sha256_of_the_canonical_bytes_in_lowercase_hex() -> None:
    value = {"b": [1, 2.5, "x"], "a": None}

    digest = fingerprint(value)

    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == hashlib.sha256(b'{"a":null,"b":[1,2.5,"x"]}').hexdigest()


def test_fingerprint_is_deterministic() -> None:
    def build() -> dict[str, Any]:
        return {"z": [1, {"q": "é"}], "a": 0.1}

    assert fingerprint(build()) == fingerprint(build()) == fingerprint(build())


def test_fingerprint_passes_default_through() -> None:
    assert fingerprint(Opaque(), default=lambda o: "opaque") == fingerprint("opaque")


# --- Arbitrary values: the generator the bench times on --------------------------------


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("shape", sorted(ARBITRARY_SHAPES))
def test_arbitrary_value_of_every_kind_is_identical_to_rfc8785(shape: str, seed: int) -> None:
    value = ARBITRARY_SHAPES[shape](3000, seed)

    assert canonical_json(value) == rfc8785.dumps(value)
    assert fingerprint(value) == hashlib.sha256(rfc8785.dumps(value)).hexdigest()


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**64), st.integers(min_value=2, max_value=1500))
def test_arbitrary_mix_of_any_seed_and_size_is_identical_to_rfc8785(seed: int, size: int) -> None:
    value = arbitrary_mix(size, seed)

    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_arbitrary_doubles_and_strings_are_written_like_rfc8785(rng: Any) -> None:
    doubles = [arbitrary_double(rng) for _ in range(20)]
    strings = {arbitrary_string(rng, 6): arbitrary_string(rng, 30) for _ in range(6)}

    assert canonical_json([doubles, strings]) == rfc8785.dumps([doubles, strings])


@pytest.mark.parametrize("shape", sorted(ARBITRARY_SHAPES))
def test_arbitrary_value_is_the_same_for_the_same_size_and_seed(shape: str) -> None:
    build = ARBITRARY_SHAPES[shape]

    assert build(2000, 7) == build(2000, 7)
    assert build(2000, 7) != build(2000, 8)
    assert len(json.dumps(build(2000, 7), ensure_ascii=False).encode()) >= 2000


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value) + [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_arbitrary_doubles_span_every_layout_from_subnormal_to_largest() -> None:
    doubles = [x for x in _leaves(ARBITRARY_SHAPES["any-float"](20_000, 1)) if type(x) is float]
    magnitudes = {abs(x) for x in doubles if x}

    assert min(magnitudes) < 1e-300 and max(magnitudes) > 1e300
    for low, high in [(1e-9, 1e-7), (1e-6, 1e-4), (1e-4, 1e16), (1e16, 1e21)]:
        assert any(low <= m < high for m in magnitudes), (low, high)
    assert any(x < 0 for x in doubles) and any(x % 1.0 == 0 for x in doubles)
    # Full precision: most doubles need 16 or 17 significant digits.
    digits = [
        len(repr(x).split("e")[0].replace("-", "").replace(".", "").lstrip("0")) for x in doubles
    ]
    assert sum(d >= 16 for d in digits) > len(digits) / 2


def test_arbitrary_strings_hold_every_range_the_encoder_branches_on() -> None:
    strings = _leaves(ARBITRARY_SHAPES["any-string"](20_000, 1))
    text = "".join(leaf for leaf in strings if isinstance(leaf, str))

    assert {"\u2028", "\u2029", '"', "\\", "\x00", "\x1f"} <= set(text)
    assert any(ord(c) > 0xFFFF for c in text) and any(0xE000 <= ord(c) <= 0xFFFF for c in text)
    assert any(ord(c) < 0x20 for c in text)
    assert re.search(r"(.)\1\1\1", text), "no repeated run"
    text.encode("utf-8")  # no lone surrogate


def test_arbitrary_mix_has_objects_whose_utf16_key_order_differs() -> None:
    def reordered(value: Any) -> int:
        if isinstance(value, dict):
            keys = list(value)
            own = sorted(keys) != sorted(keys, key=lambda k: k.encode("utf-16-be"))
            return own + sum(reordered(item) for item in value.values())
        if isinstance(value, list):
            return sum(reordered(item) for item in value)
        return 0

    value = arbitrary_mix(20_000, 1)
    kinds = {type(leaf) for leaf in _leaves(value)}

    assert reordered(value) > 0
    assert {str, int, float, bool, type(None)} <= kinds


# --- The compiled pass: what it takes, what it hands back ------------------------------


def _nested(levels: int) -> Any:
    value: Any = 1.5
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


needs_compiled = pytest.mark.skipif(
    not idemstore.hashing.COMPILED and not os.environ.get("IDEMSTORE_TEST_REQUIRE_ALL"),
    reason="the compiled pass was not built (no C compiler at install)",
)


def compiled_json(value: Any) -> bytes | None:
    from idemstore._canonical import canonical_json as compiled

    return compiled(value)


@needs_compiled
def test_the_compiled_pass_is_in_use_where_it_was_built() -> None:
    assert idemstore.hashing.COMPILED
    # The bench's arbitrary values are plain: the compiled pass writes them itself, rather
    # than handing every one back (which would pass every differential test, slowly).
    for shape, build in sorted(ARBITRARY_SHAPES.items()):
        value = build(3000, 3)
        assert compiled_json(value) == rfc8785.dumps(value), shape


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(json_values)
def test_the_compiled_pass_writes_every_plain_value_itself(value: Any) -> None:
    assert compiled_json(value) == rfc8785.dumps(value)


@needs_compiled
@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**53 + 1},
        [float("nan")],
        {"s": "\ud800"},
        {"\udfff": 1},
        {1: "x"},
        [IntEnum("Size", "S M")(1)],
        {"k": {StrEnum("Kind", "a b").a: 1}},
        (Opaque(),),
        _nested(257),
    ],
    ids=["big int", "nan", "lone surrogate", "surrogate key", "int key", "IntEnum", "StrEnum key",
         "foreign object", "257 levels"],
)  # fmt: skip
def test_the_compiled_pass_hands_back_what_only_the_python_pass_decides(value: Any) -> None:
    assert compiled_json(value) is None


@needs_compiled
def test_the_compiled_pass_writes_256_levels_itself_on_a_small_thread_stack() -> None:
    # Its depth limit is there for threads with small stacks (musl's default is 128 KiB).
    value = _nested(256)
    written: list[bytes | None] = []
    previous = threading.stack_size(128 * 1024)
    try:
        thread = threading.Thread(target=lambda: written.append(compiled_json(value)))
        thread.start()
        thread.join()
    finally:
        threading.stack_size(previous)

    assert written == [rfc8785.dumps(value)]
