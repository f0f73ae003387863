"""Numbers as RFC 8785 (JCS) writes them: ECMAScript's Number.prototype.toString layout of a
double, and the extension of ``idemstore.hashing`` to integers a double cannot hold.

``float.__repr__`` and ECMAScript both pick the shortest digits that round-trip; they differ
only in layout. repr is plain for 1e-4 <= |x| < 1e16 and ECMAScript for 1e-6 <= |x| < 1e21,
repr pads the exponent to two digits, and repr keeps a ``.0`` on integral values.
"""

from __future__ import annotations

from math import isfinite

__all__ = ["NotAJSONNumber", "big_int_text", "ecmascript_text", "odd_float"]


class NotAJSONNumber(ValueError):
    """A number JSON cannot carry: NaN, an infinity, or an integer too long for decimal."""


def ecmascript_text(value: float) -> str:
    """ECMAScript Number.prototype.toString of a finite double (RFC 8785 section 3.2.2.3)."""
    text = repr(value)
    # Only exponent forms ("e") and "nan"/"inf" (the only reprs with an "n") need more than
    # dropping a trailing ".0": repr's plain range is inside ECMAScript's.
    if "e" not in text and "n" not in text:
        if text[-2:] == ".0":
            return "0" if text == "-0.0" else text[:-2]
        return text
    if not isfinite(value):
        raise NotAJSONNumber(f"{text} is not a JSON number")
    mantissa, _, exponent = text.partition("e")
    sign = ""
    if mantissa[0] == "-":
        sign = "-"
        mantissa = mantissa[1:]
    digits = mantissa.replace(".", "")
    k = len(digits)
    n = int(exponent) + 1  # the value is 0.DIGITS * 10**n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    e_text = ("e+" if e >= 0 else "e-") + str(abs(e))
    if k == 1:
        return sign + digits + e_text
    return sign + digits[0] + "." + digits[1:] + e_text


# The exponents repr writes for the two ranges where its layout is not ECMAScript's, by how
# ECMAScript writes them: from 1e16 the digits padded to this many places, below 1e-6 the
# exponent without its leading zero, from 1e-6 "0." and this many zeros before the digits.
_ODD_EXPONENTS: dict[str, int | str] = {
    **{f"e+{e}": e + 1 for e in range(16, 21)},
    **{f"e-0{e}": "e-0" for e in range(7, 10)},
    "e-06": "0.00000",
    "e-05": "0.0000",
}


def odd_float(value: float) -> int | str:
    """The JCS form of a double of 1e-9 <= |x| < 1e-4 or 1e16 <= |x| < 1e21 (NaN and the
    infinities are refused), the ranges where repr writes an exponent and ECMAScript none or
    one of one digit: from 1e16 as the int whose digits it is (which the JSON encoder writes
    as they are, with no placeholder to remove), below 1e-4 as its text. Its repr is re-laid
    out by a table of its exponent: this is the float-heavy hot path of ``idemstore.hashing``,
    where each string operation counts."""
    text = float.__repr__(value)
    layout = _ODD_EXPONENTS.get(text[-4:])
    if layout is None:  # "nan", "inf" or "-inf": each finite double of the ranges is listed
        raise NotAJSONNumber(f"{text} is not a JSON number")
    if layout == "e-0":
        return text.replace("e-0", "e-")
    digits = text[:-4].replace(".", "")
    if isinstance(layout, int):
        return int(digits.ljust(layout + (text[0] == "-"), "0"))
    if text[0] == "-":
        return "-" + layout + digits[1:]
    return layout + digits


def big_int_text(value: int) -> str:
    """An integer beyond +-2**53: as the double that holds it exactly, else its exact digits."""
    nearest: str | None = None
    try:
        as_float = float(value)
    except OverflowError:
        pass
    else:
        if int(as_float) == value:
            return ecmascript_text(as_float)
        nearest = ecmascript_text(as_float)
    try:
        digits = int.__repr__(value)
    except ValueError:
        # Beyond sys.get_int_max_str_digits(); json.loads could not have produced it either.
        raise NotAJSONNumber("integer has too many digits to write in decimal") from None
    if digits == nearest:
        # Below 1e21 ECMAScript pads a double's shortest digits with zeros, so the double
        # 2**60 is written "1152921504606847000", which is also the exact digits of a different
        # integer. Write that integer in exponent form instead, which no double below 1e21
        # ever takes: equal text still means equal numbers.
        sign, body = ("-", digits[1:]) if digits[0] == "-" else ("", digits)
        significant = body.rstrip("0")
        mantissa = significant[0] + ("." + significant[1:] if len(significant) > 1 else "")
        return f"{sign}{mantissa}e+{len(body) - 1}"
    return digits
