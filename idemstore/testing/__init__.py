"""idemstore's store contract suite, shipped as a pytest plugin.

Installing idemstore registers this module with pytest (the ``pytest11`` entry point
``idemstore.testing``); where plugin autoloading is off, ``pytest_plugins =
["idemstore.testing"]`` in a ``conftest.py`` loads it. Loaded, it does nothing until asked.

One line of configuration runs the whole contract suite (``idemstore.testing.contract``)
against a store::

    [pytest]
    idemstore_contract = mystore://?option=1

Each line of ``idemstore_contract`` (or each ``--idemstore-contract SPEC``) is one store the
suite runs on, as a test id of its own:

- a store URL: opened afresh for every test. ``{tmp_path}`` in it becomes the test's temporary
  directory and ``{unique}`` a fresh token (for a key prefix, a table, a schema), so every test
  sees an empty store; its schema is brought up to date first (``idemstore.backends.schema``);
- ``package.module:factory``: called for every test, with no arguments; it returns a store, a
  store URL, or an awaitable of either;
- the id of a registered fixture variant (``sqlite-file``, ``postgres``, ``redis-cluster``…,
  see ``idemstore.backends.registry``).

With no ``idemstore_contract`` the suite runs on every registered fixture variant: that is
what idemstore's own test run does. The suite's tests take the fixture ``store``; a test
module of a backend's own may take it too.

For a backend's own tests, two tools: ``FaultProxy`` (a loopback TCP proxy in front of the
engine that adds latency, drops requests or replies, resets connections and goes half-open)
and ``FakeClock`` (a ``clock=`` the test moves by hand, frozen, ticking or skewed).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import inspect
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

from idemstore.backends.registry import engines, fixture_variants, load_target, scheme_of
from idemstore.backends.schema import run_schema
from idemstore.backends.urls import open_store, redact_url
from idemstore.install_lines import install_hint
from idemstore.testing.clocks import FakeClock
from idemstore.testing.faults import FaultProxy
from idemstore.testing.fixtures import backend_unavailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from idemstore.protocol import IdempotencyStore

__all__ = [
    "CONTRACT_DIR",
    "ContractTarget",
    "FakeClock",
    "FaultProxy",
    "backend_unavailable",
    "contract_targets",
    "idemstore_contract_target",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_ignore_collect",
    "pytest_pycollect_makeitem",
    "store",
]

CONTRACT_DIR = Path(__file__).resolve().parent / "contract"
INI_OPTION = "idemstore_contract"

# pytest-asyncio runs the suite; without it this plugin must still load quietly (pytest loads
# it in every environment idemstore is installed in), and only asking for the suite is an error.
_HAS_PYTEST_ASYNCIO = importlib.util.find_spec("pytest_asyncio") is not None
_F = TypeVar("_F", bound="Callable[..., Any]")


def _async_fixture(function: _F) -> _F:
    if _HAS_PYTEST_ASYNCIO:
        import pytest_asyncio

        return cast("_F", pytest_asyncio.fixture(function))
    return cast("_F", pytest.fixture(function))


@dataclass(frozen=True, slots=True)
class ContractTarget:
    """One store the contract suite runs on: ``kind`` is ``variant`` (``value`` is a fixture
    name), ``url`` (a URL template) or ``factory`` (``"module:callable"``)."""

    id: str
    kind: str
    value: str


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("idemstore", "idemstore contract suite")
    group.addoption(
        "--idemstore-contract",
        action="append",
        dest=INI_OPTION,
        metavar="SPEC",
        help="run idemstore's contract suite on this store URL, module:factory or fixture "
        "variant id (repeatable; overrides the idemstore_contract ini option)",
    )
    parser.addini(
        INI_OPTION,
        type="linelist",
        default=[],
        help="stores (URL, module:factory or fixture variant id, one per line) that "
        "idemstore's contract suite runs on; setting it collects the suite",
    )


def _specs(config: pytest.Config) -> list[str]:
    given = config.getoption(INI_OPTION) or config.getini(INI_OPTION)
    return [spec.strip() for spec in given if spec.strip()]


def _target(spec: str, seen: dict[str, int]) -> ContractTarget:
    if "://" in spec:
        kind, base = "url", scheme_of(spec)
    elif ":" in spec:
        kind, base = "factory", spec.rsplit(":", 1)[1].rsplit(".", 1)[-1]
    else:
        variants = {variant.id: variant for variant in fixture_variants()}
        variant = variants.get(spec)
        if variant is None:
            raise pytest.UsageError(
                f"{INI_OPTION}: {spec!r} is not a URL, a module:factory or a fixture variant "
                f"id; registered variant ids: {', '.join(sorted(variants))}"
            )
        return ContractTarget(variant.id, "variant", variant.fixture)
    seen[base] = seen.get(base, 0) + 1
    name = base if seen[base] == 1 else f"{base}-{seen[base]}"
    return ContractTarget(name, kind, spec)


def contract_targets(config: pytest.Config) -> list[ContractTarget]:
    """The stores the ``store`` fixture is parametrized over in this session."""
    specs = _specs(config)
    if not specs:
        return [
            ContractTarget(variant.id, "variant", variant.fixture) for variant in fixture_variants()
        ]
    seen: dict[str, int] = {}
    return [_target(spec, seen) for spec in specs]


# The directories between a collected argument and the suite that pytest would otherwise skip
# (a virtualenv, a norecursedirs match), when the suite must be reached through them.
_WAY_DOWN = pytest.StashKey[tuple[Path, ...]]()


def _skipped(config: pytest.Config, directory: Path) -> bool:
    """Whether pytest's own rules skip ``directory`` when it recurses into its parent."""
    if (directory / "pyvenv.cfg").is_file() and not config.getoption("collect_in_virtualenv"):
        return True
    patterns = config.getini("norecursedirs")
    return any(fnmatch.fnmatch(directory.name, pattern) for pattern in patterns)


def _add_the_suite(config: pytest.Config) -> None:
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args]
    if any(path == CONTRACT_DIR or CONTRACT_DIR in path.parents for path in paths):
        return  # named already
    above = [path for path in paths if path in CONTRACT_DIR.parents]
    if not above:
        config.args.append(str(CONTRACT_DIR))
        return
    # An argument above the suite (the project, with its virtualenv inside): pytest would drop
    # the suite's folder as an argument below it, then skip the virtualenv on the way down.
    # Walk that way instead, and nothing beside it.
    between = [d for d in reversed(CONTRACT_DIR.parents) if above[0] in d.parents]
    for index, directory in enumerate(between):
        if _skipped(config, directory):
            config.stash[_WAY_DOWN] = tuple(between[index:])
            return


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    way_down = config.stash.get(_WAY_DOWN, ())
    if not way_down:
        return None
    path = Path(collection_path)
    if path in way_down:
        return False  # towards the suite, even inside a virtualenv
    if path == CONTRACT_DIR or CONTRACT_DIR in path.parents:
        return None  # the suite itself: pytest's rules
    if any(directory in path.parents for directory in way_down):
        return True  # beside the way down: the rest of the virtualenv is not for this run
    return None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # Each engine's fixtures come from the module its registry entry names: an engine
    # registered by a plugin loaded before this point gets its fixtures the same way.
    for engine in engines():
        if engine.fixture_module is not None:
            config.pluginmanager.import_plugin(engine.fixture_module)
    # Asking for the suite by configuration collects it, unless paths were named on the
    # command line (then the caller chose what runs: name the suite's folder, or use
    # --pyargs idemstore.testing.contract).
    if _specs(config) and not _HAS_PYTEST_ASYNCIO:
        raise pytest.UsageError(
            f"idemstore's contract suite needs pytest-asyncio: {install_hint('testing')}"
        )
    contract_targets(config)  # a spec that names nothing is a usage error, said once, now
    if _specs(config) and config.args_source is not pytest.Config.ArgsSource.ARGS:
        _add_the_suite(config)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    # The suite's tests are plain ``async def``: mark them for pytest-asyncio here, before the
    # item is made, so they run the same in a project whose asyncio_mode is strict.
    if inspect.iscoroutinefunction(obj) and CONTRACT_DIR in Path(collector.path).parents:
        marks = getattr(obj, "pytestmark", [])
        if not any(mark.name == "asyncio" for mark in marks):
            pytest.mark.asyncio(obj)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "idemstore_contract_target" in metafunc.fixturenames:
        targets = contract_targets(metafunc.config)
        metafunc.parametrize(
            "idemstore_contract_target",
            targets,
            ids=[target.id for target in targets],
            indirect=True,
        )


@pytest.fixture
def idemstore_contract_target(request: pytest.FixtureRequest) -> ContractTarget:
    """The store this test of the contract suite runs on (parametrized by the plugin)."""
    target: ContractTarget | None = getattr(request, "param", None)
    if target is None:
        pytest.fail("idemstore_contract_target is parametrized by idemstore.testing only")
    return target


def _fill(template: str, tmp_path: Path) -> str:
    return template.replace("{tmp_path}", str(tmp_path)).replace("{unique}", uuid.uuid4().hex[:12])


async def _made_by(target: ContractTarget) -> Any:
    made = load_target(target.value)()
    if inspect.isawaitable(made):
        made = await made
    return made


@_async_fixture
async def store(
    request: pytest.FixtureRequest,
    idemstore_contract_target: ContractTarget,
    tmp_path: Path,
) -> AsyncIterator[IdempotencyStore]:
    """A fresh, empty, entered store of the target under test; closed after the test."""
    target = idemstore_contract_target
    made: Any
    if target.kind == "variant":
        made = request.getfixturevalue(target.value)
    elif target.kind == "url":
        made = _fill(target.value, tmp_path)
    else:
        made = await _made_by(target)
    if isinstance(made, str):
        if target.kind != "variant":
            try:
                await run_schema(made, "apply")
            except ImportError as exc:
                backend_unavailable(target.id, f"{redact_url(made)}: {exc}")
        made = open_store(made)
    async with made as opened:
        yield opened
