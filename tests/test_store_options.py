"""Each store's options table is the one declaration: its constructor's signature, its URL
parsing and its docs page all agree with it."""

from __future__ import annotations

import difflib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from idemstore.backends.registry import load_target
from idemstore.backends.store_options import Option, Options, at_least, one_of
from idemstore.backends.urls import open_store, parse_store_url
from idemstore.errors import ConfigurationError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "backends"
MARKED = re.compile(
    r"<!-- store-options: (?P<target>\S+) -->\n(?P<table>.*?)<!-- /store-options -->", re.DOTALL
)

# Each store whose constructor checks its options with a table, and the table.
TABLES = {
    "idemstore.backends.memory:MemoryStore": "idemstore.backends.memory:OPTIONS",
    "idemstore.backends.sqlite:SQLiteStore": "idemstore.backends.sqlite.options:OPTIONS",
    "idemstore.backends.postgres:PostgresStore": "idemstore.backends.postgres.options:OPTIONS",
    "idemstore.backends.dynamodb:DynamoDBStore": "idemstore.backends.dynamodb.options:OPTIONS",
    "idemstore.backends.redis:RedisStore": "idemstore.backends.redis.options:OPTIONS",
}

# Keywords a constructor takes that are not options: Postgres the URL shown in errors; Redis
# that too, and what a URL's scheme, path and user part say (its hosts are positional).
NOT_OPTIONS = {
    "idemstore.backends.redis:RedisStore": {
        "url",
        "cluster",
        "sentinel_service",
        "username",
        "password",
    },
}


def marked_tables() -> list[tuple[str, str, str]]:
    """(page, table target, the table as the page shows it) for every marked table."""
    return [
        (page.name, found["target"], found["table"])
        for page in sorted(DOCS.glob("*.md"))
        for found in MARKED.finditer(page.read_text(encoding="utf-8"))
    ]


def test_docs_options_tables_match_the_declared_options() -> None:
    drift = []
    for page, target, shown in marked_tables():
        declared = load_target(target).markdown()
        if shown != declared:
            drift += difflib.unified_diff(
                shown.splitlines(keepends=True),
                declared.splitlines(keepends=True),
                f"{page} (as written)",
                f"{target}.markdown() (paste this between the markers)",
            )
    assert not drift, "".join(drift)


def test_every_store_with_a_table_has_it_in_its_docs() -> None:
    assert {target for _, target, _ in marked_tables()} == set(TABLES.values())


@pytest.mark.parametrize("store", sorted(TABLES))
def test_constructor_signature_and_table_declare_the_same_defaults(store: str) -> None:
    table: Options = load_target(TABLES[store])
    parameters = inspect.signature(load_target(store).__init__).parameters
    keywords = {
        name: parameter.default
        for name, parameter in parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    declared = {option.name: option.default for option in table}
    assert {name: keywords[name] for name in declared if name in keywords} == declared
    assert set(keywords) - set(declared) <= NOT_OPTIONS.get(store, {"url"})


def test_an_unknown_option_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store("sqlite:///x.db?colour=blue")
    assert str(caught.value) == (
        "unknown option(s) for sqlite:// stores: colour; "
        "known: auto_migrate, busy_timeout, clock, max_key_length, synchronous"
    )


def test_query_text_is_converted_to_each_option_kind() -> None:
    table = Options(
        Option("n", int, 1, ""),
        Option("seconds", float, 1.0, ""),
        Option("on", bool, False, ""),
        Option("name", str, "x", ""),
        Option("maybe", str, None, ""),
    )
    parsed = parse_store_url("memory://?n=3&seconds=0.5&on=yes&name=y&maybe=")
    assert table.from_url(parsed) == {
        "n": 3,
        "seconds": 0.5,
        "on": True,
        "name": "y",
        "maybe": None,
    }


def test_options_not_given_are_left_to_the_constructor_defaults() -> None:
    table = Options(Option("n", int, 1, ""))
    assert table.from_url(parse_store_url("memory://")) == {}


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (Option("n", int, 1, "", at_least(1)), 0, "n must be at least 1, not 0"),
        (Option("n", int, 1, ""), True, "n must be an integer, not True"),
        (Option("n", int, 1, ""), "3", "n must be an integer, not '3'"),
        (Option("s", float, 1.0, "", at_least(0)), float("nan"), "s must be at least 0"),
        (Option("mode", str, "a", "", one_of("a", "b")), "c", "mode must be one of a, b"),
        (Option("on", bool, True, ""), 1, "on must be true or false, not 1"),
    ],
)
def test_the_constructor_check_refuses_a_bad_value(
    option: Option, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Options(option).check({option.name: value})


def test_the_constructor_check_returns_the_values_to_keep() -> None:
    table = Options(Option("mode", str, "a", "", one_of("a", "b")), Option("n", int, 1, ""))
    assert table.check({"mode": "B", "n": 2, "self": object()}) == {"mode": "b", "n": 2}


def test_constructors_check_their_options_through_the_table() -> None:
    from idemstore.backends.memory import MemoryStore
    from idemstore.backends.postgres import PostgresStore
    from idemstore.backends.redis import RedisStore
    from idemstore.backends.sqlite import SQLiteStore

    with pytest.raises(ConfigurationError, match="max_key_length must be at least 1"):
        MemoryStore(max_key_length=0)
    with pytest.raises(ConfigurationError, match="synchronous must be one of full, normal"):
        SQLiteStore("x.db", synchronous="off")
    with pytest.raises(ConfigurationError, match="sweep_batch_size must be at least 1"):
        PostgresStore("postgresql://localhost/db", sweep_batch_size=0)
    with pytest.raises(ConfigurationError, match="max_connections must be at least 1"):
        RedisStore([("localhost", 6379)], max_connections=0)


def test_a_table_refuses_an_option_declared_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        Options(Option("n", int, 1, ""), Option("n", int, 2, ""))


def test_the_docs_table_shows_url_options_only_with_readable_defaults() -> None:
    table = Options(
        Option("seconds", float, 5.0, "how long"),
        Option("on", bool, True, "whether"),
        Option("dsn", str, None, "where", shown_default="the store's URL"),
        Option("clock", object, None, "time", url=False),
    )
    assert table.markdown() == (
        "| option | default | meaning |\n"
        "|---|---|---|\n"
        "| `seconds` | `5` | how long |\n"
        "| `on` | `true` | whether |\n"
        "| `dsn` | the store's URL | where |\n"
    )
