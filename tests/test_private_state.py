"""No module reads or writes another module's private state.

A private attribute (``_name``, not dunder) belongs to the module whose class defines it: the
class assigns it through ``self``/``cls``, lists it in ``__slots__``, annotates it in its body,
or defines a method of that name (reading it through ``self`` or ``super()`` defines nothing).
Any module may use a private attribute through ``self``, ``cls`` or ``super()``; through any
other object (``execution._state``, ``store._dsn``) only the module that owns the name may.
Without types, an object's class is unknown, so the rule goes by name, and is sound one way
only:

- a reach-in is ``obj._name`` (read, write or call) in module M, where ``obj`` is not
  ``self``/``cls``/``super()``, ``_name`` is owned by a class of another module of idemstore,
  and by no class of M itself;
- a name M owns too (say ``_store``, which many classes hold) is M's to use: a reach-in through
  such a shared name goes unseen, which is why shared state should get a public name, not a
  second private one;
- a third-party object's private name that an idemstore class happens to share is listed in
  ``THIRD_PARTY`` with the reason it is used (aiosqlite has no public way in).

A module's own helpers go through the public (or named-transition) interface of another
module's classes, the way ``idemstore.execution.settling`` drives an ``Execution``.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.test_module_boundaries import PACKAGE, module_name

# Private names of a third party's objects, per module that uses them: not idemstore state.
THIRD_PARTY = {
    # aiosqlite.Connection's _conn and _execute: the only way to run a function on its thread.
    "idemstore.backends.sqlite.transactions": {"_conn", "_execute"},
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _through_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def owned_names(tree: ast.AST) -> set[str]:
    """The private attribute names the classes of a module define."""
    owned: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                owned.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                owned.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                owned.add(node.target.id)
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
            ):
                owned |= {
                    slot.value
                    for slot in ast.walk(node.value)
                    if isinstance(slot, ast.Constant) and isinstance(slot.value, str)
                }
    return {name for name in owned if _private(name)}


def reach_ins(sources: dict[str, str]) -> dict[str, list[str]]:
    """Per module, each ``line: expression`` that uses another module's private attribute."""
    trees = {module: ast.parse(source) for module, source in sources.items()}
    owners: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for name in owned_names(tree):
            owners[name].add(module)
    found: dict[str, list[str]] = {}
    for module, tree in trees.items():
        allowed = THIRD_PARTY.get(module, set())
        hits = [
            f"{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and _private(node.attr)
            and not _through_self(node.value)
            and owners[node.attr] - {module}
            and module not in owners[node.attr]
            and node.attr not in allowed
        ]
        if hits:
            found[module] = sorted(hits, key=lambda hit: int(hit.partition(":")[0]))
    return found


def test_no_module_reaches_into_another_modules_private_state() -> None:
    sources = {
        module_name(path): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert reach_ins(sources) == {}


def test_the_check_sees_a_planted_reach_in() -> None:
    machine = (
        "class Execution:\n"
        "    __slots__ = ('_state',)\n"
        "    def __init__(self):\n"
        "        self._policy = None\n"
        "    def _claim(self, state):\n"
        "        self._state = state\n"
        "def own(execution):\n"
        "    return execution._state  # its own module: allowed\n"
    )
    helper = (
        "class Helper:\n"
        "    def __init__(self, execution):\n"
        "        self._execution = execution\n"
        "    def settle(self, execution):\n"
        "        execution._state = 'settled'\n"
        "        self._execution._claim('settling')\n"
        "        return execution.policy, self._execution, super()._claim\n"
        "def later(execution):\n"
        "    return execution._policy\n"
    )
    assert reach_ins({"idemstore.machine": machine, "idemstore.helper": helper}) == {
        "idemstore.helper": [
            "5: execution._state",
            "6: self._execution._claim",
            "9: execution._policy",
        ]
    }


def test_a_third_partys_private_name_is_not_idemstore_state() -> None:
    source = "def raw(conn):\n    return conn._conn\n"
    owner = "class Store:\n    def __init__(self):\n        self._conn = None\n"
    modules = {"idemstore.backends.sqlite.transactions": source, "idemstore.store": owner}
    assert reach_ins(modules) == {}
    assert reach_ins({"idemstore.elsewhere": source, "idemstore.store": owner}) == {
        "idemstore.elsewhere": ["2: conn._conn"]
    }
