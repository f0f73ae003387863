"""Builds the optional compiled pass of ``idemstore.hashing`` (``idemstore/_canonical.c``).

Hatchling runs this for every wheel, editable ones included. With a C compiler the wheel gets
the extension and a platform tag; without one (or with ``IDEMSTORE_PURE_PYTHON=1``) it stays
a pure-Python wheel and ``fingerprint`` writes the same bytes more slowly. An editable install
puts the extension beside the sources, where the checkout imports it from.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MODULE = "idemstore._canonical"
SOURCE = "idemstore/_canonical.c"


class CompiledHasher(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("IDEMSTORE_PURE_PYTHON", "") not in ("", "0"):
            self.app.display_info("IDEMSTORE_PURE_PYTHON is set: no compiled hasher")
            return
        self._scratch = tempfile.mkdtemp(prefix="idemstore-build-")
        try:
            built = _compile(Path(self.root), Path(self._scratch))
        except Exception as error:  # any compiler or toolchain failure: the pure wheel
            self.app.display_warning(
                f"idemstore: the compiled hasher was not built ({error}); fingerprint() will"
                " use its pure-Python pass (same bytes, slower)"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        target = f"idemstore/{built.name}"
        if version == "editable":
            # Renamed into place: lanes of the same Python may build at once.
            staged = Path(self.root) / f"{target}.{os.getpid()}"
            shutil.copyfile(built, staged)
            os.replace(staged, Path(self.root) / target)
        else:
            build_data["force_include"][str(built)] = target

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _compile(root: Path, scratch: Path) -> Path:
    """The extension built by setuptools' build_ext (it knows each platform's compiler and
    flags) into ``scratch``; returns its path."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    extension = Extension(MODULE, [str(root / SOURCE)])
    command = build_ext(Distribution({"name": "idemstore", "ext_modules": [extension]}))
    command.build_lib = str(scratch / "lib")
    command.build_temp = str(scratch / "objects")
    command.ensure_finalized()
    command.run()
    return Path(command.get_ext_fullpath(MODULE))
