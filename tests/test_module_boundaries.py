"""Modules talk through public names: no module imports a private (``_``-led, not dunder) name
from a module of another package, so a consumer never depends on another consumer's internals.
The parts of one engine's package (say ``idemstore.backends.redis``) may share theirs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "idemstore"


def private_imports(source: str, module: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("idemstore"):
            parent = module.rpartition(".")[0]
            if node.module == module or (
                parent.startswith("idemstore.backends.") and node.module.startswith(parent + ".")
            ):
                continue  # itself, or a part of the same engine's package
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_a_private_name_from_another() -> None:
    offenders = {
        module_name(path): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := private_imports(path.read_text(encoding="utf-8"), module_name(path)))
    }
    assert offenders == {}


def test_the_check_sees_a_private_import() -> None:
    source = (
        "from idemstore.runner import _Heartbeat\n"
        "from idemstore.execution import Execution\n"
        "from idemstore import __version__\n"
        "from idemstore.mcp.outcomes import _Outcome\n"
    )
    assert private_imports(source, "idemstore.mcp.proxy") == [
        "idemstore.runner._Heartbeat",
        "idemstore.mcp.outcomes._Outcome",
    ]
    engine_part = "from idemstore.backends.redis.scripts import _SCRIPTS\n"
    assert private_imports(engine_part, "idemstore.backends.redis.store") == []


# The import graph: which modules of idemstore running a module imports (at its top or inside
# a function: both run). ``if TYPE_CHECKING:`` blocks never run and are left out. An edge goes
# to the module named, not to its parent packages (importing ``a.b`` also runs ``a``, which
# every submodule would share).
EXECUTION_PATH = {
    "idemstore.execution",
    "idemstore.execution.lease_keeping",
    "idemstore.execution.outcome_markers",
    "idemstore.execution.policy",
    "idemstore.execution.recovery_points",
    "idemstore.execution.running_work",
    "idemstore.execution.settling",
    "idemstore.execution.state_machine",
    "idemstore.runner",
    "idemstore.backends.sweeper",
}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(source: str, module: str, modules: set[str], *, package: bool) -> set[str]:
    """The modules of ``modules`` that running ``source`` (the module ``module``) imports."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:  # "import a.b.c" of a name in a.b
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # "from a import b", b a module
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    names = set(paths)
    return {
        name: imported_modules(
            path.read_text(encoding="utf-8"), name, names, package=path.name == "__init__.py"
        )
        for name, path in paths.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(cycles)


def reachable(graph: dict[str, set[str]], starts: set[str]) -> set[str]:
    seen: set[str] = set()
    pending = list(starts)
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(graph[node])
    return seen


def test_no_modules_of_idemstore_import_each_other_in_a_circle() -> None:
    assert import_cycles(import_graph()) == []


def test_telemetry_imports_nothing_of_the_execution_path() -> None:
    graph = import_graph()
    telemetry = {name for name in graph if name.split(".")[:2] == ["idemstore", "telemetry"]}
    imported = reachable(graph, telemetry) - telemetry
    assert not imported & EXECUTION_PATH
    # What telemetry may read: the hooks the execution path declares, the store protocol, the
    # errors and the install line its missing-API error gives. A new import here is a
    # decision, not an accident.
    assert imported == {
        "idemstore.errors",
        "idemstore.execution.hooks",
        "idemstore.install_lines",
        "idemstore.protocol",
    }


def test_the_execution_path_imports_nothing_of_telemetry() -> None:
    graph = import_graph()
    for module in sorted(EXECUTION_PATH):
        assert not {
            name for name in reachable(graph, {module}) if name.startswith("idemstore.telemetry")
        }, module


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import idemstore.protocol\n"
        "from idemstore import telemetry, __version__\n"
        "from . import records\n"
        "if TYPE_CHECKING:\n"
        "    from idemstore.execution import Execution\n"
        "else:\n"
        "    from idemstore.errors import ConflictError\n"
        "def later():\n"
        "    from idemstore.telemetry.store import InstrumentedStore\n"
    )
    modules = {
        "idemstore",
        "idemstore.errors",
        "idemstore.execution",
        "idemstore.protocol",
        "idemstore.records",
        "idemstore.sweeper",
        "idemstore.telemetry",
        "idemstore.telemetry.store",
    }
    assert imported_modules(source, "idemstore.sweeper", modules, package=False) == {
        "idemstore",  # __version__ is no module: importing it runs the package
        "idemstore.errors",
        "idemstore.protocol",
        "idemstore.records",
        "idemstore.telemetry",
        "idemstore.telemetry.store",
    }


def test_the_cycle_check_finds_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
