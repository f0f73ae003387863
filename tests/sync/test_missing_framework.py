"""Without their framework installed, the Django, FastAPI and Celery doors say which extra to
install, in the form that works from a checkout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("module", "framework"),
    [("http.django", "django"), ("http.fastapi", "fastapi"), ("consumers.celery", "celery")],
)
def test_importing_a_door_without_its_framework_names_the_extra(
    module: str, framework: str
) -> None:
    # A None entry in sys.modules makes the import fail as an uninstalled package does.
    code = (
        f"import sys; sys.modules[{framework!r}] = None\n"
        "from idemstore.errors import MissingDependencyError\n"
        "try:\n"
        f"    import idemstore.{module}\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert f"pip install '.[{framework}]'" in done.stdout
