"""The fingerprint field selection: RFC 6901 pointers, checked once, applied without copying
the caller's values."""

from __future__ import annotations

import pytest

from idemstore.errors import ConfigurationError
from idemstore.fingerprint_fields import field_selection, parse_pointer, readable_again


def test_pointer_tokens_unescape_tilde_and_slash_in_the_rfc_6901_order() -> None:
    assert parse_pointer("x", "/meta/sent_at") == ("meta", "sent_at")
    assert parse_pointer("x", "/a~1b/c~0d") == ("a/b", "c~d")
    assert parse_pointer("x", "/~01") == ("~1",)
    assert parse_pointer("x", "/") == ("",)


@pytest.mark.parametrize(
    ("pointer", "message"),
    [
        ("trace_id", "start it with /, as '/trace_id'"),
        ("meta.sent_at", "'/meta/sent_at'"),
        ("", "whole document"),
        ("/a~2", "~0"),
        (3, "not a JSON pointer"),
    ],
)
def test_a_bad_pointer_is_refused_with_what_to_write(pointer: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match="fingerprint_exclude") as raised:
        field_selection(None, [pointer])
    assert message in str(raised.value)


def test_include_and_exclude_together_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        field_selection(["/a"], ["/b"])


def test_a_string_or_an_empty_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="list of JSON pointers"):
        field_selection("/a", None)
    with pytest.raises(ConfigurationError, match="empty list"):
        field_selection(None, [])
    assert field_selection(None, None) is None


def test_exclude_removes_members_and_leaves_the_document_as_it_was() -> None:
    selection = field_selection(None, ["/meta/sent_at", "/items/0", "/missing/deeper"])
    assert selection is not None
    document = {"meta": {"sent_at": 1, "source": "app"}, "items": [{"x": 1}, {"x": 2}]}
    assert selection.apply(document) == {"meta": {"source": "app"}, "items": [{"x": 2}]}
    assert document == {"meta": {"sent_at": 1, "source": "app"}, "items": [{"x": 1}, {"x": 2}]}


def test_include_tells_an_absent_field_from_a_null_one() -> None:
    selection = field_selection(["/amount", "/items/1"], None)
    assert selection is not None
    assert selection.apply({"amount": None, "other": 1}) != selection.apply({"other": 1})
    assert selection.apply({"amount": 5, "items": [0, 7], "noise": 1}) == selection.apply(
        {"amount": 5, "items": [9, 7]}
    )


def test_array_indexes_follow_rfc_6901_no_leading_zero_and_no_dash() -> None:
    selection = field_selection(None, ["/items/01", "/items/-"])
    assert selection is not None
    assert selection.apply({"items": [1, 2]}) == {"items": [1, 2]}


def test_a_generator_of_pointers_can_be_read_again_after_a_fork() -> None:
    pointers = readable_again(p for p in ["/a"])
    assert field_selection(None, pointers) is not None
    assert field_selection(None, pointers) is not None
