"""The import rules of the package's rooms (docs/architecture.md), checked on the import graph
of ``test_module_boundaries`` (what running a module imports; ``TYPE_CHECKING`` blocks left
out). Data flows one way: door → execution path → contract ← backends.

- the contract (the root modules of shared rules) imports only the contract;
- the execution path (``execution/``) imports only itself and the contract;
- nothing but a door, the CLI and the bench imports a door: the core (contract, execution
  path, runner, sync door, backends and their plumbing, telemetry, testing) never does;
- a door imports no module of another door (a door is a family: the HTTP doors, MCP, the
  message consumers);
- nothing outside ``backends/`` imports or names an engine's module
  (``idemstore.backends.<engine>``); the registry, in ``backends/``, is where engines are named;
- ``backends/`` imports, outside itself, the contract and the two hooks named below.
"""

from __future__ import annotations

import ast

from tests.test_module_boundaries import PACKAGE, import_graph, module_name

CONTRACT = {
    "idemstore.callers",
    "idemstore.checkpoints",
    "idemstore.errors",
    "idemstore.fingerprint_fields",
    "idemstore.forwarded_options",
    "idemstore.hashing",
    "idemstore.install_lines",
    "idemstore.json_numbers",
    "idemstore.protocol",
    "idemstore.records",
    "idemstore.serializers",
}

# Each door family, by its package: HTTP, MCP, and the consumers (Celery, brokers, Lambda).
DOORS = {
    "http": ("idemstore.http",),
    "mcp": ("idemstore.mcp",),
    "consumers": ("idemstore.consumers",),
}

# What may put doors together: the command line and the benchmarks (they drive every door).
DOOR_USERS = ("idemstore.cli", "idemstore.__main__", "idemstore.bench")

ENGINES = ("dynamodb", "memory", "postgres", "redis", "sqlite")

# What backends/ reads from outside itself besides the contract: the observer slot the
# sweeper reports to, and the store wrapper open_store(..., instrument) returns.
BACKENDS_ALSO = {"idemstore.execution.hooks", "idemstore.telemetry"}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def door_of(module: str) -> str | None:
    return next((door for door, prefixes in DOORS.items() if _within(module, prefixes)), None)


def engine_module(module: str) -> bool:
    return _within(module, tuple(f"idemstore.backends.{engine}" for engine in ENGINES))


def door_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import of a door that the rules forbid."""
    found = []
    for module, imported in sorted(graph.items()):
        door = door_of(module)
        if door is None and _within(module, DOOR_USERS):
            continue
        found += [
            f"{module} -> {target}"
            for target in sorted(imported)
            if (target_door := door_of(target)) is not None and target_door != door
        ]
    return found


def engine_violations(graph: dict[str, set[str]], sources: dict[str, str]) -> list[str]:
    """Modules outside backends/ that import an engine's module or name one in a string."""
    found = []
    for module, imported in sorted(graph.items()):
        if _within(module, ("idemstore.backends",)):
            continue
        found += [f"{module} -> {target}" for target in sorted(imported) if engine_module(target)]
        found += [
            f"{module} names {node.value!r}"
            for node in ast.walk(ast.parse(sources.get(module, "")))
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and engine_module(node.value.partition(":")[0])
        ]
    return found


def _sources() -> dict[str, str]:
    return {
        module_name(path): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def outside(graph: dict[str, set[str]], prefix: str) -> set[str]:
    """What the modules under ``prefix`` import from outside it."""
    return {
        target
        for module, imported in graph.items()
        if _within(module, (prefix,))
        for target in imported
        if not _within(target, (prefix,))
    }


def test_the_contract_imports_only_the_contract() -> None:
    graph = import_graph()
    assert {module: graph[module] - CONTRACT for module in CONTRACT} == {
        module: set() for module in CONTRACT
    }


def test_the_execution_path_imports_only_itself_and_the_contract() -> None:
    assert outside(import_graph(), "idemstore.execution") - CONTRACT == set()


def test_backends_import_the_contract_and_nothing_of_the_doors_or_the_execution_path() -> None:
    assert outside(import_graph(), "idemstore.backends") - CONTRACT == BACKENDS_ALSO


def test_the_core_imports_no_door_and_no_door_imports_another() -> None:
    assert door_violations(import_graph()) == []


def test_nothing_outside_backends_names_an_engine_module() -> None:
    assert engine_violations(import_graph(), _sources()) == []


def test_the_door_check_sees_a_planted_violation() -> None:
    graph = {
        "idemstore.runner": {"idemstore.http.asgi"},  # the core imports a door
        "idemstore.consumers.sqs": {"idemstore.mcp.proxy"},  # a door imports another
        "idemstore.http.django": {"idemstore.http.asgi", "idemstore.http.wsgi"},  # one family
        "idemstore.consumers.celery": {"idemstore.execution"},
        "idemstore.cli": {"idemstore.mcp.commands"},
        "idemstore.execution.policy": {"idemstore.http.wsgi"},
        "idemstore.consumers.aws_lambda": {"idemstore.problems"},  # a shared core module
    }
    assert door_violations(graph) == [
        "idemstore.consumers.sqs -> idemstore.mcp.proxy",
        "idemstore.execution.policy -> idemstore.http.wsgi",
        "idemstore.runner -> idemstore.http.asgi",
    ]


def test_the_engine_check_sees_a_planted_violation() -> None:
    graph = {
        "idemstore.testing.fixtures.redis": {"idemstore.backends.redis.store"},
        "idemstore.sync": {"idemstore.backends.urls"},
        "idemstore.backends.registry": set(),
        "idemstore.cli": set(),
    }
    sources = {
        "idemstore.backends.registry": 'STORE = "idemstore.backends.sqlite:SQLiteStore"\n',
        "idemstore.cli": 'TARGET = "idemstore.backends.postgres.store:PostgresStore"\n',
    }
    assert engine_violations(graph, sources) == [
        "idemstore.cli names 'idemstore.backends.postgres.store:PostgresStore'",
        "idemstore.testing.fixtures.redis -> idemstore.backends.redis.store",
    ]
