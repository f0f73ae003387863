"""The engines idemstore knows, each described once.

An ``Engine`` says everything the rest of the package needs to know about a backend: its URL
schemes, where its store class lives, which driver and pip extra it needs, what kind of schema
it keeps, the raw-driver floor ``idemstore bench`` compares it with, how ``bench --local``
starts a server for it, and which test-fixture variants run the contract suite on it. Every
target is a ``"package.module:Name"`` string imported only when it is used, so reading the
registry imports no driver.

``open_store``, ``idemstore migrate``, ``idemstore bench`` and the pytest plugin
(``idemstore.testing``) read this registry; none of them names an engine. A backend written
outside this package joins them all with one ``register_backend(Engine(...))`` call.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from idemstore.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "SQL_MIGRATIONS",
    "TABLE",
    "Engine",
    "FixtureVariant",
    "engine_for_scheme",
    "engine_for_url",
    "engines",
    "fixture_variants",
    "known_schemes",
    "imported_on_first_use",
    "load_target",
    "register_backend",
    "scheme_of",
]

# Schema kinds ``idemstore.backends.schema`` implements; an engine may also name its own
# adapter class.
SQL_MIGRATIONS = "sql-migrations"  # migrations/<engine name>/NNNN_*.sql, via SupportsMigrations
TABLE = "table"  # a table the store creates and describes itself, via SupportsTableSchema


@dataclass(frozen=True, slots=True)
class FixtureVariant:
    """One way the test fixtures run an engine, and one id of the contract suite's ``store``.

    ``fixture`` names a function-scoped pytest fixture that returns the URL of a fresh, empty,
    migrated store. ``cross_process`` says several OS processes can share that store (the
    process-race and history tests run on those).
    """

    id: str
    fixture: str
    cross_process: bool = True


@dataclass(frozen=True, slots=True)
class Engine:
    """Everything idemstore needs to know about one backend.

    ``store`` is ``"module:Class"``; the class has ``from_url(url, **options)``. ``driver`` is
    the top-level module it imports and ``extra`` the pip extra that installs it. ``schema``
    is ``SQL_MIGRATIONS``, ``TABLE``, a ``"module:Class"`` adapter of the schema protocol, or
    ``None`` (nothing to migrate). ``floor`` is ``"module:Class"`` with ``from_url(url)``
    returning an ``idemstore.bench.floors.Floor``; ``launcher`` is ``"module:function"``
    taking a directory and returning a running server with ``.url`` and ``.stop()``.
    ``embedded`` is the URL of a store that runs in-process, with no server (``{dir}`` becomes
    a fresh temporary directory): ``idemstore bench`` measures it when given no URL.
    ``install`` is the command that installs the driver when no idemstore extra does (a
    backend shipped in a package of its own: ``"pip install 'acme-idemstore'"``); error
    messages and ``idemstore options`` give it in place of idemstore's extra
    (``idemstore.install_lines.install_hint``).
    ``variants`` are the ids of the contract suite's ``store`` fixture on this engine, each
    with the fixture returning a fresh store URL; ``fixture_module`` is the module of pytest
    fixtures that defines them (loaded by ``idemstore.testing``; ``None`` when the fixtures
    come from a plugin or conftest of their own).
    ``options`` is ``"module:NAME"`` of the store's ``Options`` table, in a module that
    imports no driver: ``idemstore options`` prints it without the driver installed (``None``:
    the engine declares no table, and the CLI says so).
    ``labels`` maps a scheme to the name bench reports give it when that is not ``name``
    (a Redis Cluster is measured apart from a single Redis). ``report_packages`` are further
    distributions whose versions a bench report states.
    """

    name: str
    schemes: tuple[str, ...]
    store: str
    driver: str | None = None
    extra: str | None = None
    schema: str | None = None
    floor: str | None = None
    launcher: str | None = None
    embedded: str | None = None
    variants: tuple[FixtureVariant, ...] = ()
    fixture_module: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    report_packages: tuple[str, ...] = ()
    options: str | None = None
    install: str | None = None

    def __post_init__(self) -> None:
        if not self.schemes:
            raise ConfigurationError(f"engine {self.name!r} declares no URL scheme")
        for target in (self.store, self.floor, self.launcher, self.options):
            if target is not None and ":" not in target:
                raise ConfigurationError(
                    f"backend target must look like 'package.module:Class', not {target!r}"
                )

    def label(self, scheme: str) -> str:
        """The name reports give a store of this engine opened with ``scheme``."""
        return dict(self.labels).get(scheme.lower(), self.name)


_BUILTIN: tuple[Engine, ...] = (
    Engine(
        name="memory",
        schemes=("memory",),
        store="idemstore.backends.memory:MemoryStore",
        options="idemstore.backends.memory:OPTIONS",
        floor="idemstore.bench.floors:MemoryFloor",
        embedded="memory://",
        fixture_module="idemstore.testing.fixtures.memory",
        variants=(FixtureVariant("memory", "memory_store_url", cross_process=False),),
    ),
    Engine(
        name="sqlite",
        schemes=("sqlite",),
        store="idemstore.backends.sqlite:SQLiteStore",
        options="idemstore.backends.sqlite.options:OPTIONS",
        driver="aiosqlite",
        extra="sqlite",
        schema=SQL_MIGRATIONS,
        floor="idemstore.bench.floors:SQLiteFloor",
        # Four slashes: an absolute path under either reading of sqlite:/// URLs. The default
        # synchronous=FULL, as a store opened without options has.
        embedded="sqlite:///{dir}/bench.db",
        fixture_module="idemstore.testing.fixtures.sqlite",
        variants=(
            FixtureVariant("sqlite-file", "sqlite_file_store_url"),
            FixtureVariant("sqlite-memory", "sqlite_memory_store_url", cross_process=False),
        ),
    ),
    Engine(
        name="postgres",
        schemes=("postgresql", "postgres"),
        store="idemstore.backends.postgres:PostgresStore",
        options="idemstore.backends.postgres.options:OPTIONS",
        driver="asyncpg",
        extra="postgres",
        schema=SQL_MIGRATIONS,
        floor="idemstore.bench.postgres_floor:PostgresFloor",
        launcher="idemstore.bench.local:start_postgres_for_bench",
        fixture_module="idemstore.testing.fixtures.postgres",
        variants=(
            FixtureVariant("postgres", "postgres_store_url"),
            FixtureVariant("pgbouncer", "pgbouncer_store_url"),
        ),
    ),
    Engine(
        name="redis",
        schemes=("redis", "rediss", "redis+cluster", "redis+sentinel"),
        store="idemstore.backends.redis:RedisStore",
        options="idemstore.backends.redis.options:OPTIONS",
        driver="redis",
        extra="redis",
        floor="idemstore.bench.floors:RedisFloor",
        launcher="idemstore.bench.local:start_redis_for_bench",
        fixture_module="idemstore.testing.fixtures.redis",
        variants=(
            FixtureVariant("redis", "redis_store_url"),
            FixtureVariant("redis-cluster", "redis_cluster_store_url"),
        ),
        labels=(("redis+cluster", "redis-cluster"),),
        report_packages=("hiredis",),
    ),
    Engine(
        name="dynamodb",
        schemes=("dynamodb",),
        store="idemstore.backends.dynamodb:DynamoDBStore",
        options="idemstore.backends.dynamodb.options:OPTIONS",
        driver="aiobotocore",
        extra="dynamodb",
        schema=TABLE,
        floor="idemstore.bench.floors:DynamoDBFloor",
        launcher="idemstore.bench.local:start_dynamodb_for_bench",
        fixture_module="idemstore.testing.fixtures.dynamodb",
        variants=(FixtureVariant("dynamodb", "dynamodb_store_url"),),
    ),
)

_ENGINES: dict[str, Engine] = {}
_SCHEMES: dict[str, Engine] = {}


def _add(engine: Engine) -> Engine:
    # A scheme names one engine: the new declaration takes its schemes from any older one
    # (which keeps the rest, or goes when none is left), and replaces an engine of its name.
    taken = {scheme.lower() for scheme in engine.schemes}
    kept: dict[str, Engine] = {}
    for name, other in _ENGINES.items():
        if name == engine.name:
            continue
        left = tuple(scheme for scheme in other.schemes if scheme.lower() not in taken)
        if left:
            kept[name] = other if left == other.schemes else replace(other, schemes=left)
    kept[engine.name] = engine
    _ENGINES.clear()
    _ENGINES.update(kept)
    _SCHEMES.clear()
    for known in _ENGINES.values():
        for scheme in known.schemes:
            _SCHEMES[scheme.lower()] = known
    return engine


for _engine in _BUILTIN:
    _add(_engine)


def register_backend(scheme: str | Engine, target: str | None = None) -> Engine:
    """Make ``open_store`` (and ``migrate``, ``bench``, the contract suite) know a backend.

    ``register_backend("mystore", "mypkg.store:MyStore")`` is the short form: ``open_store``
    builds ``MyStore.from_url(url, **options)`` for ``mystore://`` URLs, importing the module
    only then. ``register_backend(Engine(...))`` declares everything at once (schema kind,
    bench floor, test-fixture variants). Registering a name or scheme again replaces it.
    """
    if isinstance(scheme, Engine):
        if target is not None:
            raise ConfigurationError("register_backend(Engine(...)) takes no target")
        return _add(scheme)
    if target is None or ":" not in target:
        raise ConfigurationError(
            f"backend target must look like 'package.module:Class', not {target!r}"
        )
    name = scheme.lower()
    return _add(Engine(name=name, schemes=(name,), store=target))


def engines() -> tuple[Engine, ...]:
    """Every registered engine, built-in ones first, in registration order."""
    return tuple(_ENGINES.values())


def known_schemes() -> list[str]:
    """Every scheme ``open_store`` accepts, sorted."""
    return sorted(_SCHEMES)


def scheme_of(url: str) -> str:
    """The lower-cased scheme of ``url`` (``""`` when it has none)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def engine_for_scheme(scheme: str) -> Engine | None:
    return _SCHEMES.get(scheme.lower())


def engine_for_url(url: str) -> Engine | None:
    """The engine a store URL names, ``None`` for an unknown scheme."""
    return _SCHEMES.get(scheme_of(url))


def fixture_variants() -> tuple[FixtureVariant, ...]:
    """Every test-fixture variant of every engine, in registration order."""
    return tuple(variant for engine in _ENGINES.values() for variant in engine.variants)


def load_target(target: str) -> Any:
    """Import ``"package.module:Name"`` (``Name`` may be dotted) and return the object."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"target must look like 'package.module:Name', not {target!r}")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def imported_on_first_use(package: str, **targets: str) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that imports each of ``targets`` (name to ``"module:Name"``)
    when it is first read: a backend package's store, and with it the driver, loads on use, so
    its driver-free modules (``options``) read without the driver installed."""

    def __getattr__(name: str) -> Any:
        if name in targets:
            return load_target(targets[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
