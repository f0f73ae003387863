from __future__ import annotations

import pytest

import idemstore
from idemstore import (
    ConfigurationError,
    Engine,
    MissingDependencyError,
    open_store,
    register_backend,
)
from idemstore.backends.memory import MemoryStore
from idemstore.backends.registry import engine_for_scheme, engines, load_target, scheme_of
from idemstore.backends.urls import known_schemes, redact_url


def test_memory_url_builds_a_memory_store() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store("mongodb://localhost")
    for scheme in (
        "memory",
        "sqlite",
        "postgresql",
        "redis",
        "rediss",
        "redis+cluster",
        "dynamodb",
    ):
        assert scheme in str(caught.value)


def test_a_string_without_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        open_store("localhost:6379")


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="colour"):
        open_store("memory://?colour=blue")


def test_keyword_options_reach_the_backend() -> None:
    store = open_store("memory://", max_key_length=10)
    assert isinstance(store, MemoryStore)


def test_every_documented_scheme_is_known() -> None:
    assert set(known_schemes()) >= {
        "memory",
        "sqlite",
        "postgresql",
        "postgres",
        "redis",
        "rediss",
        "redis+cluster",
        "dynamodb",
    }


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    with pytest.raises(
        MissingDependencyError, match=r"pip install '\.\[redis\]' \(in idemstore's checkout\)"
    ):
        open_store("redis://127.0.0.1:6379")
    assert issubclass(MissingDependencyError, ImportError)


def test_register_backend_adds_a_scheme(scratch_registry: None) -> None:
    register_backend("mem2", "idemstore.backends.memory:MemoryStore")
    assert isinstance(open_store("mem2://"), MemoryStore)


def test_register_backend_refuses_a_target_without_class(scratch_registry: None) -> None:
    with pytest.raises(ConfigurationError):
        register_backend("bad", "idemstore.backends.memory")


def test_redact_url_hides_the_password() -> None:
    redacted = redact_url("postgresql://app:s3cret@db:5432/main")
    assert "s3cret" not in redacted
    assert redacted == "postgresql://app:***@db:5432/main"
    assert redact_url("redis://localhost:6379/0") == "redis://localhost:6379/0"


def test_public_names_import_from_the_package() -> None:
    for name in (
        "IdempotencyStore",
        "Record",
        "Lease",
        "Reservation",
        "Outcome",
        "Status",
        "open_store",
        "register_backend",
        "fingerprint",
        "canonical_json",
        "Idempotency",
        "Result",
        "IdemstoreError",
        "ConfigurationError",
        "MissingDependencyError",
        "StoreUnavailableError",
        "SchemaError",
        "InvalidKeyError",
        "ResponseTooLargeError",
        "ConflictError",
        "InProgressError",
        "LeaseLostError",
        "Sweeper",
    ):
        assert name in idemstore.__all__
        assert getattr(idemstore, name) is not None
    assert {o.name for o in idemstore.Outcome} == {
        "ACQUIRED",
        "COMPLETED",
        "IN_PROGRESS",
        "MISMATCH",
    }
    assert {s.name for s in idemstore.Status} == {"IN_PROGRESS", "COMPLETED"}


def test_every_error_has_one_root() -> None:
    for name in idemstore.errors.__all__:
        assert issubclass(getattr(idemstore.errors, name), idemstore.IdemstoreError)


# -- the registry ----------------------------------------------------------------------------


async def test_one_full_declaration_reaches_open_store_migrate_and_bench(
    scratch_registry: None,
) -> None:
    from idemstore.backends.schema import run_schema
    from idemstore.bench.floors import MemoryFloor, floor_for_url
    from idemstore.bench.runner import name_targets

    register_backend(
        Engine(
            name="scratch",
            schemes=("scratch", "scratch+tls"),
            store="idemstore.backends.memory:MemoryStore",
            floor="idemstore.bench.floors:MemoryFloor",
            labels=(("scratch+tls", "scratch-tls"),),
        )
    )
    assert {"scratch", "scratch+tls"} <= set(known_schemes())
    assert isinstance(open_store("scratch+tls://"), MemoryStore)
    assert isinstance(floor_for_url("scratch://"), MemoryFloor)
    assert [t.name for t in name_targets(["scratch://", "scratch+tls://"])] == [
        "scratch",
        "scratch-tls",
    ]
    report = await run_schema("scratch://", "status")
    assert report.up_to_date and "keep no schema" in report.render()


def test_a_scheme_registered_again_moves_to_the_new_engine(scratch_registry: None) -> None:
    target = "idemstore.backends.memory:MemoryStore"
    register_backend(Engine(name="first", schemes=("one", "two"), store=target))
    register_backend(Engine(name="second", schemes=("two",), store=target))
    first, second = engine_for_scheme("one"), engine_for_scheme("two")
    assert first is not None and first.name == "first" and first.schemes == ("one",)
    assert second is not None and second.name == "second"
    register_backend(Engine(name="third", schemes=("one",), store=target))
    assert "first" not in {engine.name for engine in engines()}


def test_a_missing_driver_is_named_before_the_backend_module_is_imported(
    scratch_registry: None,
) -> None:
    register_backend(
        Engine(
            name="needs",
            schemes=("needs",),
            store="no_such_package.store:Store",
            driver="no_such_driver",
            extra="needs",
        )
    )
    with pytest.raises(
        MissingDependencyError, match=r"pip install '\.\[needs\]' \(in idemstore's checkout\)"
    ):
        open_store("needs://")


def test_every_engine_target_is_importable() -> None:
    for engine in engines():
        for target in (engine.store, engine.floor, engine.launcher):
            if target is not None:
                assert callable(load_target(target)), target
        if engine.fixture_module is not None:
            import importlib

            module = importlib.import_module(engine.fixture_module)
            for variant in engine.variants:
                assert hasattr(module, variant.fixture), (engine.name, variant.fixture)


def test_open_store_reads_the_scheme_as_the_registry_does() -> None:
    # One reading: any case, and a string without "://" has none.
    assert isinstance(open_store("MEMORY://"), MemoryStore)
    assert scheme_of("MEMORY://") == "memory"
    assert scheme_of("memory") == ""
    with pytest.raises(ConfigurationError, match="is not a store URL"):
        open_store("memory")


def test_a_store_target_in_a_missing_idemstore_module_is_not_part_of_this_version(
    scratch_registry: None,
) -> None:
    register_backend("later", "idemstore.backends.later:LaterStore")
    with pytest.raises(ConfigurationError, match="not part of this version of idemstore"):
        open_store("later://")


def test_a_store_target_dotted_inside_its_module_is_loaded_like_any_registry_target(
    scratch_registry: None,
) -> None:
    # open_store loads targets with the registry's load_target, so "module:Outer.Inner" works.
    register_backend("nested", "tests.test_urls:Nested.Store")
    assert isinstance(open_store("nested://"), MemoryStore)


class Nested:
    Store = MemoryStore
