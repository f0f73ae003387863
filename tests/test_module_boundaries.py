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
