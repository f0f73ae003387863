"""Canonical JSON (RFC 8785, JCS) and the request fingerprint built on it.

``canonical_json`` is byte-identical to RFC 8785 for every value in its domain, and extends
it to integers a double cannot hold: such an integer is written with its exact decimal
digits, while an integer a double holds exactly is written as that double. So ``1`` and
``1.0``, or ``10**21`` and ``1e21``, give the same bytes, and two numbers give the same bytes
exactly when they are mathematically equal.

How it is fast: the standard library's C JSON encoder (compact separators, sorted keys, no
ASCII escaping) already writes JCS for strings, literals, structure, integers up to 2**53 and
most floats. One Python pass over the value validates it and rewrites only what that encoder
would get wrong for JCS: floats whose ``repr`` is not their ECMAScript form, integers beyond
2**53, keys whose code-point order is not their UTF-16 order, subclasses, and ``default=``
conversions. A number the encoder cannot be made to write is passed as a placeholder string
that is unquoted afterwards.

Faster still where the package was built with a C compiler: ``idemstore/_canonical.c`` writes
the canonical bytes of a plain value (exact JSON types, integers within 2**53, finite floats,
no lone surrogate, at most 256 levels) in one pass, and hands anything else back to the Python
pass above, which keeps the extension to big integers, the ``default=`` conversions and every
error with its path. ``COMPILED`` says which is in use; ``IDEMSTORE_PURE_PYTHON=1`` in the
environment at import turns the compiled pass off. Both give the same bytes (the tests run
every differential case through each).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from typing import TYPE_CHECKING, Any

from idemstore.errors import CanonicalizationError
from idemstore.json_numbers import NotAJSONNumber, big_int_text, ecmascript_text, odd_float

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["COMPILED", "canonical_json", "fingerprint"]

# Containers (and ``default`` conversions) nested deeper than this are refused, so a cycle
# or a hostile input fails cleanly instead of exhausting the stack.
_MAX_DEPTH = 1000

# Every integer of at most this magnitude is exactly a double whose JCS form is its plain
# decimal digits, so it needs neither a float round trip nor the exponent rules.
_EXACT_INT = 2**53
_LEAST_EXACT_INT = -_EXACT_INT  # a constant: negating the name would build an int per test

_TOO_DEEP = (
    f"value is nested too deeply (over {_MAX_DEPTH} levels, or past the interpreter's"
    " recursion limit) or contains a reference cycle"
)

# JCS escapes exactly the controls U+0000-U+001F (\b \t \n \f \r by name, the rest as
# lowercase \u00xx), '"' and '\', and writes everything else as UTF-8: that is what the C
# encoder does with ensure_ascii=False. allow_nan=False is a second guard (the pass below
# already refuses NaN and infinities); check_circular=False because that pass bounds depth.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    separators=(",", ":"),
    sort_keys=True,
    allow_nan=False,
    check_circular=False,
)


def _one_call_encoder() -> Callable[[object], str]:
    """``_ENCODER.encode`` without building a C encoder on every call (a tenth of the time
    on a small value), where this interpreter's ``json`` has the C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    e = _ENCODER
    try:
        # The arguments JSONEncoder.iterencode passes, in its order.
        encode = make(
            None,
            e.default,
            json.encoder.encode_basestring,
            e.indent,
            e.key_separator,
            e.item_separator,
            e.sort_keys,
            e.skipkeys,
            e.allow_nan,
        )
    except TypeError:  # a signature this module does not know
        return _ENCODER.encode
    join = "".join
    return lambda value: join(encode(value, 0))


_encode = _one_call_encoder()


def _compiled_pass() -> Callable[[object], bytes | None] | None:
    """``idemstore._canonical.canonical_json`` where it was built and is not turned off: the
    canonical bytes of a plain value, None for a value only the Python pass handles."""
    if os.environ.get("IDEMSTORE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from idemstore._canonical import canonical_json as compiled
    except ImportError:  # installed from an sdist without a C compiler: the pure pass alone
        return None
    return compiled


_compiled = _compiled_pass()

COMPILED: bool = _compiled is not None
"""Whether ``canonical_json`` and ``fingerprint`` use the compiled pass (see the module's doc)."""

# Wraps the JCS text of a number the encoder cannot be made to write (such as 1e-7, which
# repr writes 1e-07): the encoder quotes it as a string, and the quotes and marks are removed
# afterwards. First three control characters, which the encoder writes escaped, so the text
# stays ASCII where the value is (a surrogate would make the encoder, the unmarking and the
# UTF-8 encoding work on wider characters). A caller's string can hold that same sequence
# (as the characters or as their escapes); a mark count that does not add up then sends the
# value through again with a lone surrogate as the mark, which no string the caller may pass
# can contain (every string with one is refused). One control was too few: any U+001F in a
# value cost it a second pass.
_MARK = "\x1f\x1e\x1d"
_SURROGATE_MARK = "\udfff"
_WRITTEN = {_MARK: "\\u001f\\u001e\\u001d", _SURROGATE_MARK: _SURROGATE_MARK}  # as written
# The codec's own function: str.encode looked the codec up by name for every key sorted.
_utf16_units = codecs.utf_16_be_encode
_sha256 = hashlib.sha256

# The rarer first: most objects that lack one lack this one.
_LATE_BMP = re.compile("[\ue000-\uffff]")
_NON_BMP = re.compile("[\U00010000-\U0010ffff]")


class _Failure(Exception):
    """Internal: carries a message and the path segments collected while unwinding."""

    def __init__(self, message: str, *segments: str | int) -> None:
        super().__init__(message)
        self.message = message
        # Innermost segment first; each enclosing container appends its own on the way out.
        self.segments: list[str | int] = list(segments)

    def to_error(self) -> CanonicalizationError:
        return CanonicalizationError(self.message, _pointer(reversed(self.segments)))


def _pointer(segments: Iterable[str | int]) -> str:
    parts = []
    for segment in segments:
        text = str(segment).replace("~", "~0").replace("/", "~1")
        # A lone surrogate in a key would make the message itself unprintable.
        parts.append("/" + text.encode("utf-8", "backslashreplace").decode("utf-8"))
    return "".join(parts)


class _Placed(str):
    """A key of an object already in RFC 8785 order: never less than another key.

    The encoder sorts keys with ``<`` only, and its sort is stable; keys none of which is
    less than another therefore stay in the order they were inserted, which is UTF-16
    code-unit order. The encoder writes them as plain strings.
    """

    __slots__ = ()

    # The keys of one object are distinct, so never equal: str.__eq__ answers "not less"
    # without a Python frame per comparison.
    __lt__ = str.__eq__


class _Run:
    """What one canonicalization carries beside the value."""

    __slots__ = ("default", "mark", "marks")

    def __init__(self, default: Callable[[Any], object] | None, mark: str) -> None:
        self.default = default
        self.mark = mark
        self.marks = 0  # placeholders written; each puts two marks in the text


def _placeholder(text: str, run: _Run) -> str:
    run.marks += 1
    return run.mark + text + run.mark


def _float_for_encoder(value: float, run: _Run) -> object:
    """A float, as the float, int or placeholder the encoder writes as its JCS form."""
    text = ecmascript_text(value)
    if "." not in text and "e" not in text:
        # Integral: JCS writes the digits (zero-padded past 2**53), as the encoder writes
        # this int.
        return int(text)
    if text == float.__repr__(value):
        return value
    return _placeholder(text, run)


def _int_for_encoder(value: int, run: _Run) -> object:
    """An integer beyond +-2**53, as the int or placeholder the encoder writes as its form."""
    text = big_int_text(value)
    if text.lstrip("-").isdigit():
        return int(text)
    return _placeholder(text, run)


# The functions below are one validating pass over a value, returning what the encoder writes
# as its JCS form: the value itself when the encoder already writes it right (containers are
# copied only when something in them changes), or a copy with the changes. On a problem they
# raise _Failure, whose segments locate it.
#
# The scalar dispatch is repeated in _object and _array rather than factored out: a call per
# scalar would cost more than all the rest of the pass.


def _value(value: object, run: _Run, depth: int) -> object:
    """Any value: the top level, a subclass of a JSON type, or a foreign object."""
    if depth >= _MAX_DEPTH:
        raise _Failure(_TOO_DEEP)
    kind = type(value)
    if kind is dict:
        return _object(value, run, depth)  # type: ignore[arg-type]
    if kind is list or kind is tuple:
        return _array(value, run, depth)  # type: ignore[arg-type]
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        # The encoder writes a str subclass by its characters, like a str.
        return value
    if isinstance(value, int):
        # int(), not the value: an IntEnum's repr is not its number.
        number = int(value)
        return number if _LEAST_EXACT_INT <= number <= _EXACT_INT else _int_for_encoder(number, run)
    if isinstance(value, float):
        return _float_for_encoder(float(value), run)
    if isinstance(value, dict):
        return _object(dict(value), run, depth)
    if isinstance(value, list | tuple):
        return _array(list(value), run, depth)
    if run.default is None:
        raise _Failure(f"{kind.__name__} is not a JSON type (and no default= was given)")
    return _value(run.default(value), run, depth + 1)


def _non_str_key(obj: dict[Any, Any]) -> _Failure:
    for key in obj:
        if not isinstance(key, str):
            return _Failure(f"object key {key!r} ({type(key).__name__}) is not a str", str(key))
    raise AssertionError("called for an object whose keys are all str")


def _object(obj: dict[Any, Any], run: _Run, depth: int) -> object:
    if depth >= _MAX_DEPTH:
        raise _Failure(_TOO_DEEP)
    depth += 1
    try:
        # One C-level pass both type-checks the keys and finds whether they are all ASCII.
        keys = "".join(obj)
    except TypeError:
        raise _non_str_key(obj) from None
    changed: dict[Any, Any] | None = None
    key: str = ""
    new: object
    try:
        for key, item in obj.items():
            kind = type(item)
            if kind is str:
                continue
            if kind is float:
                # Compared before anything is computed: most doubles fall in a range where
                # repr already writes what ECMAScript does.
                if 1e-4 <= item < 1e16 or -1e16 < item <= -1e-4:
                    if item % 1.0:
                        continue  # plain decimals, alike in both
                    new = int(item)  # JCS writes an integral double's digits, no ".0"
                elif 1e21 <= item < 1e309 or -1e309 < item <= -1e21 or -1e-9 < item < 1e-9:
                    # Exponents of two or three digits, alike in both (1e309 is infinity,
                    # kept out); and zero, which JCS writes 0 whatever its sign.
                    if item:
                        continue
                    new = 0
                else:
                    # And NaN and the infinities, refused there. Placed inline: a call costs.
                    new = odd_float(item)
                    if type(new) is str:
                        run.marks += 1
                        new = f"{run.mark}{new}{run.mark}"
            elif kind is int:
                if _LEAST_EXACT_INT <= item <= _EXACT_INT:
                    continue
                new = _int_for_encoder(item, run)
            elif kind is dict:
                if not item:
                    continue  # {} needs no call
                new = _object(item, run, depth)
                if new is item:
                    continue
            elif kind is list or kind is tuple:
                if not item:
                    continue  # [] and () need no call
                new = _array(item, run, depth)
                if new is item:
                    continue
            elif item is None or kind is bool:
                continue
            else:
                new = _value(item, run, depth)
                if new is item:
                    continue
            if changed is None:
                changed = dict(obj)
            changed[key] = new
    except _Failure as failure:
        failure.segments.append(key)
        raise
    except NotAJSONNumber as error:
        raise _Failure(str(error), key) from None
    except RecursionError:
        raise _Failure(_TOO_DEEP, key) from None
    result = obj if changed is None else changed
    if not keys.isascii() and len(obj) > 1 and _LATE_BMP.search(keys) and _NON_BMP.search(keys):
        return _in_utf16_order(result)
    return result


def _in_utf16_order(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` for the encoder to write in UTF-16 order, though it sorts by code point:
    sorted here (one C-level encode per key), its keys made ``_Placed`` so they stay; ``obj``
    itself when both orders agree (keys mostly differ before the gap decides)."""
    order = sorted(obj)
    # Sorted from code-point order, where the two orders mostly agree: fewer comparisons.
    by_units = sorted(order, key=_utf16_units)
    if by_units == order:
        return obj
    return {_Placed(key): obj[key] for key in by_units}


def _array(items: list[Any] | tuple[Any, ...], run: _Run, depth: int) -> object:
    if depth >= _MAX_DEPTH:
        raise _Failure(_TOO_DEEP)
    depth += 1
    changed: list[Any] | None = None
    index = 0
    new: object
    try:
        for index, item in enumerate(items):
            kind = type(item)
            if kind is str:
                continue
            if kind is float:
                if 1e-4 <= item < 1e16 or -1e16 < item <= -1e-4:
                    if item % 1.0:
                        continue
                    new = int(item)
                elif 1e21 <= item < 1e309 or -1e309 < item <= -1e21 or -1e-9 < item < 1e-9:
                    if item:
                        continue
                    new = 0
                else:
                    new = odd_float(item)
                    if type(new) is str:
                        run.marks += 1
                        new = f"{run.mark}{new}{run.mark}"
            elif kind is int:
                if _LEAST_EXACT_INT <= item <= _EXACT_INT:
                    continue
                new = _int_for_encoder(item, run)
            elif kind is dict:
                if not item:
                    continue  # {} needs no call
                new = _object(item, run, depth)
                if new is item:
                    continue
            elif kind is list or kind is tuple:
                if not item:
                    continue  # [] and () need no call
                new = _array(item, run, depth)
                if new is item:
                    continue
            elif item is None or kind is bool:
                continue
            else:
                new = _value(item, run, depth)
                if new is item:
                    continue
            if changed is None:
                changed = list(items)
            changed[index] = new
    except _Failure as failure:
        failure.segments.append(index)
        raise
    except NotAJSONNumber as error:
        raise _Failure(str(error), index) from None
    except RecursionError:
        raise _Failure(_TOO_DEEP, index) from None
    return items if changed is None else changed


def _check_unicode(value: object, default: Callable[[Any], object] | None) -> None:
    """Raise ``_Failure`` at the first string or key of ``value`` with a lone surrogate.

    Only called once the text turned out not to be Unicode, to say where: checking every
    string up front would slow the common case. ``value`` has passed ``_Pass`` already.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise _Failure(
                f"string contains a lone surrogate ({value[error.start]!r}), which is not Unicode"
            ) from None
    elif isinstance(value, dict):
        for key, item in dict(value).items():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError as error:
                raise _Failure(
                    f"object key contains a lone surrogate ({key[error.start]!r}),"
                    " which is not Unicode",
                    key,
                ) from None
            try:
                _check_unicode(item, default)
            except _Failure as failure:
                failure.segments.append(key)
                raise
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            try:
                _check_unicode(item, default)
            except _Failure as failure:
                failure.segments.append(index)
                raise
    elif default is not None and not isinstance(value, int | float) and value is not None:
        _check_unicode(default(value), default)


def _not_unicode(value: object, default: Callable[[Any], object] | None) -> CanonicalizationError:
    try:
        _check_unicode(value, default)
    except _Failure as failure:
        return failure.to_error()
    except RecursionError:
        return CanonicalizationError(_TOO_DEEP, "")
    return CanonicalizationError("value contains a lone surrogate, which is not Unicode", "")


def canonical_json(value: object, *, default: Callable[[Any], object] | None = None) -> bytes:
    """The RFC 8785 canonical form of ``value``, as UTF-8 bytes.

    ``value`` is built of dict (str keys), list, tuple, str, int, float, bool and None
    (subclasses are taken as their base type). ``default``, if given, is called on any other
    object and its return value is canonicalized in its place; it should be a pure function,
    as it may be called again for the same object while locating an error.

    Raises ``CanonicalizationError``, whose ``path`` points at the offending spot, for NaN
    and infinities, non-str keys, strings with lone surrogates, non-JSON objects without
    ``default``, and nesting deeper than 1000 levels (which includes reference cycles).
    """
    return _canonical(value, default)


def fingerprint(value: object, *, default: Callable[[Any], object] | None = None) -> str:
    """The SHA-256 of ``canonical_json(value)``, as 64 lowercase hex digits."""
    return _sha256(_canonical(value, default)).hexdigest()


def _canonical(value: object, default: Callable[[Any], object] | None) -> bytes:
    """``canonical_json``, called positionally by both public functions (a keyword call
    costs a small value's fingerprint a few percent)."""
    if _compiled is not None:
        written = _compiled(value)
        if written is not None:
            return written
    text = _text(value, default, _MARK)
    if text is None:
        # A string of the caller's holds the mark: again, with the mark no string can hold.
        text = _text(value, default, _SURROGATE_MARK)
        if text is None:
            raise _not_unicode(value, default)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _not_unicode(value, default) from None


def _text(value: object, default: Callable[[Any], object] | None, mark: str) -> str | None:
    """The canonical text of ``value`` placing numbers with ``mark``; None when a string of
    the caller's holds the mark as the encoder writes it."""
    run = _Run(default, mark)
    try:
        # The usual top level, an object, skips the general dispatch.
        ready = _object(value, run, 0) if type(value) is dict else _value(value, run, 0)
        text = _encode(ready)
    except _Failure as failure:
        raise failure.to_error() from None
    except NotAJSONNumber as error:
        raise CanonicalizationError(str(error), "") from None
    except RecursionError:
        raise CanonicalizationError(_TOO_DEEP, "") from None
    except UnicodeEncodeError:
        # A lone surrogate in a key of an object sorted by UTF-16 code units.
        raise _not_unicode(value, default) from None
    if not run.marks:
        return text
    # Around each placeholder: '"' MARK number MARK '"'. Once every mark is known to be
    # one of ours, '"' MARK only ever opens one and MARK '"' closes one.
    # Neither '"' MARK nor MARK '"' can overlap another of its kind, and removing one of
    # ours never makes or breaks another: the text shrinks by exactly our placeholders' quotes
    # and marks unless a string of the caller's made more (cheaper than counting the marks).
    written = _WRITTEN[mark]
    unmarked = text.replace('"' + written, "").replace(written + '"', "")
    if len(text) - len(unmarked) != 2 * run.marks * (len(written) + 1):
        return None
    return unmarked
