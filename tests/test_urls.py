from __future__ import annotations

import pytest

import idemstore
from idemstore import ConfigurationError, MissingDependencyError, open_store, register_backend
from idemstore.backends.memory import MemoryStore
from idemstore.urls import known_schemes, redact_url


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
    with pytest.raises(MissingDependencyError, match=r"pip install 'idemstore\[redis\]'"):
        open_store("redis://127.0.0.1:6379")
    assert issubclass(MissingDependencyError, ImportError)


def test_register_backend_adds_a_scheme() -> None:
    register_backend("mem2", "idemstore.backends.memory:MemoryStore")
    assert isinstance(open_store("mem2://"), MemoryStore)


def test_register_backend_refuses_a_target_without_class() -> None:
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
