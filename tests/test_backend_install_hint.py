"""A backend shipped in a package of its own names that package in every install hint: a
missing driver, a missing store module, and ``idemstore options``."""

from __future__ import annotations

import pytest

from idemstore.backends.registry import Engine, register_backend
from idemstore.backends.urls import open_store
from idemstore.cli import main
from idemstore.errors import MissingDependencyError

ACME = "pip install 'acme-idemstore'"


def sixth_backend(**fields: str | None) -> Engine:
    """The test tree's sixth backend (``tests/contract/sixth_backend.py``), as a package of
    its own would register it, with ``fields`` changed."""
    declared: dict[str, str | None] = {
        "store": "tests.contract.sixth_backend:SnapshotStore",
        "driver": "acme_snapshot_driver",  # installed nowhere
        "install": ACME,
    }
    declared.update(fields)
    return register_backend(Engine(name="acme", schemes=("acme",), **declared))


def test_a_missing_driver_names_the_backend_s_own_package(scratch_registry: None) -> None:
    sixth_backend()
    with pytest.raises(MissingDependencyError) as raised:
        open_store("acme://")
    assert (
        str(raised.value) == f"the acme:// backend needs the 'acme_snapshot_driver' package: {ACME}"
    )


def test_a_missing_store_module_names_the_backend_s_own_package(scratch_registry: None) -> None:
    sixth_backend(store="acme_idemstore.store:AcmeStore", driver=None)
    with pytest.raises(MissingDependencyError, match="could not import 'acme_idemstore'") as raised:
        open_store("acme://")
    assert str(raised.value).endswith(ACME)


def test_the_options_command_names_the_backend_s_own_package(
    scratch_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    sixth_backend()
    main(["options", "acme"])
    assert f"Needs acme_snapshot_driver: {ACME}" in capsys.readouterr().out


def test_without_an_install_line_the_hint_is_idemstore_s_extra(scratch_registry: None) -> None:
    sixth_backend(install=None, extra="acme")
    with pytest.raises(
        MissingDependencyError, match=r"pip install '\.\[acme\]' \(in idemstore's checkout\)$"
    ):
        open_store("acme://")
