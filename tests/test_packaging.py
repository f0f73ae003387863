"""The package installs and works from what an index would serve (its sdist and wheel), says what
to install for the rest, and its metadata agrees with the repository."""

from __future__ import annotations

import email
import email.message
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

import idemstore
from idemstore.backends.migrate import load_migrations
from tests.conftest import ROOT, make_venv, output_of
from tests.test_readme import assert_quickstart_output, noxfile_constant, quickstart_source

CORE_CHECK = textwrap.dedent(
    """
    import asyncio, importlib.util
    from idemstore import Idempotency, MissingDependencyError, fingerprint, open_store
    from idemstore.hashing import COMPILED

    assert COMPILED, "the wheel was built without the compiled hasher"

    for driver in ("aiosqlite", "asyncpg", "redis", "aiobotocore"):
        assert importlib.util.find_spec(driver) is None, driver

    async def main():
        async with open_store("memory://") as store:
            idem = Idempotency(store)
            calls = []
            async def work():
                calls.append(1)
                return b"ok"
            fp = fingerprint({"a": 1})
            await idem.run("k", fp, work)
            replay = await idem.run("k", fp, work)
            assert replay.replayed and len(calls) == 1
        try:
            open_store("redis://127.0.0.1:6379")
        except MissingDependencyError as exc:
            print(exc)
        else:
            raise SystemExit("redis:// did not raise MissingDependencyError")

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_core_install_works_without_extras(built_wheel: Path, tmp_path: Path) -> None:
    bin_dir = make_venv(tmp_path / "venv", str(built_wheel))
    printed = output_of(bin_dir / "python", "-c", CORE_CHECK, cwd=tmp_path)
    assert "pip install '.[redis]' (in idemstore's checkout)" in printed
    help_text = subprocess.run(
        [str(bin_dir / "idemstore"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "inspect" in help_text


# -- the distribution as an index sees it -------------------------------------------------------


@pytest.fixture(scope="session")
def built_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's sdist, built once per session from this checkout by ``python -m build``."""
    out = tmp_path_factory.mktemp("sdist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = out.glob("idemstore-*.tar.gz")
    return sdist


def sdist_members(sdist: Path) -> dict[str, bytes]:
    """The sdist's regular files by path below its top folder (``idemstore-X.Y.Z/``)."""
    files = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member) if member.isfile() else None
            if content is not None:
                files[member.name.split("/", 1)[1]] = content.read()
    return files


def pkg_info(raw: bytes) -> email.message.Message:
    return email.message_from_bytes(raw)


@pytest.mark.slow
def test_the_sdist_carries_the_license_changelog_migrations_and_tests(built_sdist: Path) -> None:
    files = sdist_members(built_sdist)
    assert files["LICENSE"] == (ROOT / "LICENSE").read_bytes()
    # the notice of the vendored JCS vectors stays beside them
    assert "tests/data/jcs/README.md" in files
    assert any(name.startswith("tests/data/jcs/input/") for name in files)
    assert "CHANGELOG.md" in files
    # the compiled hasher is built from the sdist by its hook
    assert {"hatch_build.py", "idemstore/_canonical.c", "idemstore/_canonical.pyi"} <= set(files)
    assert not [name for name in files if name.endswith((".so", ".pyd"))]
    assert {f"migrations/sqlite/{m.name}" for m in load_migrations("sqlite")} <= set(files)
    # tests/test_schema_file.py reads them from the sdist's tree
    assert {"migrations/sqlite/schema.sql", "migrations/postgres/schema.sql"} <= set(files)
    assert not [name for name in files if name.startswith((".nox/", ".venv/", "dist/"))]
    meta = pkg_info(files["PKG-INFO"])
    assert meta["Version"] == idemstore.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE", "tests/data/jcs/README.md"]


@pytest.mark.slow
def test_the_sdist_installs_into_a_clean_venv_and_migrates_and_runs_the_quickstart(
    built_sdist: Path, tmp_path: Path
) -> None:
    # pip builds the wheel from the sdist alone: what the checkout has beside it cannot help.
    bin_dir = make_venv(tmp_path / "venv", f"{built_sdist}[sqlite]")
    work = tmp_path / "work"  # far from the checkout: only the installed package is importable
    work.mkdir()

    def run(*args: str) -> str:
        return output_of(*args, cwd=work)

    idemstore_cli = str(bin_dir / "idemstore")
    assert "applied 0001_records.sql" in run(idemstore_cli, "migrate", "sqlite:///idem.db")
    status = run(idemstore_cli, "migrate", "sqlite:///idem.db", "--status")
    assert "0 pending" in status
    assert status.splitlines()[0].startswith(f"sqlite migrations from {tmp_path / 'venv'}")

    assert_quickstart_output(run(str(bin_dir / "python"), "-c", quickstart_source()))
    compiled = "import idemstore.hashing as h; print(h.COMPILED)"
    assert run(str(bin_dir / "python"), "-c", compiled).strip() == "True"

    # The installed distribution's metadata names its license, and the file is there.
    shown = run(
        str(bin_dir / "python"),
        "-c",
        "import importlib.metadata as m, json; d = m.distribution('idemstore');"
        "lic = [f for f in d.files if f.name == 'LICENSE'];"
        "print(json.dumps([d.version, d.metadata['License-Expression'],"
        " d.metadata.get_all('License-File'), [str(f.locate()) for f in lic]]))",
    )
    version, expression, license_files, located = json.loads(shown)
    assert version == idemstore.__version__
    assert expression == "Apache-2.0"
    assert license_files == ["LICENSE", "tests/data/jcs/README.md"]
    assert len(located) == 1
    assert Path(located[0]).read_bytes() == (ROOT / "LICENSE").read_bytes()


@pytest.mark.slow
def test_without_a_c_compiler_the_sdist_installs_the_pure_hasher_with_the_same_digests(
    built_sdist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "false")  # what setuptools compiles with: a compiler that fails
    bin_dir = make_venv(tmp_path / "venv", "--no-cache-dir", str(built_sdist))
    value = {"b": [1e-7, 2**60, "\U0001f600"], "\uffff": {"a": 1.0}, "\U00010000": None}
    shown = output_of(
        bin_dir / "python",
        "-c",
        "import idemstore.hashing as h, json, sys;"
        "print(json.dumps([h.COMPILED, h.fingerprint(json.loads(sys.argv[1]))]))",
        json.dumps(value),
        cwd=tmp_path,
    )

    assert json.loads(shown) == [False, idemstore.fingerprint(value)]


# -- metadata that must agree with the rest of the repository ---------------------------------


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# SHA-256 of the Apache License 2.0 text as the Apache Software Foundation publishes it
# (LICENSE-2.0.txt, 11,358 bytes): an edited or truncated copy is no longer that license.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_file_is_the_unmodified_apache_2_0_text() -> None:
    assert pyproject()["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256


def test_the_classifiers_claim_exactly_the_pythons_the_lanes_test() -> None:
    project = pyproject()["project"]
    prefix = "Programming Language :: Python :: 3."
    claimed = sorted(
        (
            c.removeprefix("Programming Language :: Python :: ")
            for c in project["classifiers"]
            if c.startswith(prefix)
        ),
        key=lambda v: tuple(map(int, v.split("."))),
    )
    tested = noxfile_constant("PYTHONS")
    assert claimed == tested
    assert project["requires-python"] == f">={tested[0]}"
    assert noxfile_constant("SLOW_LANE_PYTHON") in tested


def test_the_version_lives_in_one_place_and_the_changelog_has_it() -> None:
    project = pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject()["tool"]["hatch"]["version"]["path"] == "idemstore/__init__.py"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "\n## [Unreleased]\n" in changelog
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    assert released and released[0] == idemstore.__version__, released


def test_the_project_urls_point_at_the_docs_and_the_source() -> None:
    urls = pyproject()["project"]["urls"]
    assert {"Documentation", "Repository", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
