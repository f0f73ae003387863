"""The ``pip install`` line every message, help text and docs page gives for an extra.

idemstore is on no package index yet: it is installed from a checkout of its repository, so
the line that works is ``pip install '.[postgres]'``, run in the checkout. Every message that
names an install builds it here; tests/test_install_lines.py fails on any other form in the
package's strings and the docs. When the package is published, this module is what changes
(README.md says what the line will read then).
"""

from __future__ import annotations

__all__ = ["WHERE", "install_hint", "install_line"]

# Where install_line runs: what a message adds after the line.
WHERE = "in idemstore's checkout"


def install_line(*extras: str) -> str:
    """``pip install '.[a,b]'`` for ``extras`` (``pip install .`` for none)."""
    return f"pip install '.[{','.join(extras)}]'" if extras else "pip install ."


def install_hint(*extras: str) -> str:
    """The line and where to run it, for a message: ``pip install '.[otel]' (in idemstore's
    checkout)``."""
    return f"{install_line(*extras)} ({WHERE})"
