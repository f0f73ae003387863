"""A clock a test moves on an engine process: ahead, behind, or stepped mid-run.

Each ``ShiftedClock`` is a file holding an offset in seconds (``+5``, ``-1``). A process
started with ``environment()`` reads its wall clock shifted by it, and a new value written
with ``set()`` reaches the running process within ``SETTLES`` seconds (an NTP step, a
promoted replica whose clock is ahead). PostgreSQL and Python processes get libfaketime; Redis
gets ``clock_shift.c``, compiled here (libfaketime cannot start redis-server: its jemalloc
calls ``clock_gettime`` while libfaketime initialises). Only the wall clock moves; monotonic
clocks do not, as with NTP.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = ["LIBFAKETIME", "SETTLES", "ShiftedClock", "shim"]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# How long a new offset takes to reach a running process (libfaketime's cache, the shim's
# 20 ms), with room.
SETTLES = 1.5


@functools.cache
def shim() -> Path:
    """``clock_shift.c`` built once per session (skips the test without a C compiler)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the clock shim for redis-server")
    built = Path(tempfile.mkdtemp(prefix="idemstore-clock-shift-")) / "clock_shift.so"
    atexit.register(shutil.rmtree, built.parent, True)
    source = Path(__file__).with_name("clock_shift.c")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source)], check=True)
    built.parent.chmod(0o755)
    return built


class ShiftedClock:
    """An offset file; ``environment(kind)`` makes a process read the wall clock through it."""

    def __init__(self, offset: float = 0.0) -> None:
        where = Path(tempfile.mkdtemp(prefix="idemstore-clock-"))
        # PostgreSQL runs as its own user: it must read the file.
        where.chmod(0o755)
        self.file = where / "offset"
        self.offset = 0.0
        self.set(offset)

    def set(self, offset: float) -> None:
        """Move the clock to ``offset`` seconds from the real one (atomically: a reader sees
        the old value or the new one)."""
        temporary = self.file.with_suffix(".new")
        temporary.write_text(f"{offset:+g}\n")
        temporary.chmod(0o644)
        os.replace(temporary, self.file)
        self.offset = offset

    def environment(self, kind: str) -> dict[str, str]:
        """What to start a process with: ``kind`` ``redis`` (the shim) or ``faketime``."""
        if kind == "redis":
            return {"LD_PRELOAD": str(shim()), "IDEMSTORE_CLOCK_SHIFT_FILE": str(self.file)}
        if not LIBFAKETIME.exists():
            pytest.skip("libfaketime is not installed (apt-get install faketime)")
        return {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def remove(self) -> None:
        shutil.rmtree(self.file.parent, ignore_errors=True)
