"""canonical_json / fingerprint: RFC 8785 output, the documented integer extension, errors."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from idemstore.errors import CanonicalizationError
from idemstore.hashing import canonical_json, fingerprint

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
