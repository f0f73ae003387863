"""Run one page's Python blocks in order, as a reader pasting them into one session would.

``python -m tests.docs.python_blocks_runner REPORT`` reads ``[{"where": ..., "source": ...}]``
on stdin and writes to REPORT, as JSON, what each block printed and the first failure. One
process per page: blocks share a namespace (a later block may use a name an earlier one
defined), and registering a backend or opening a store leaves nothing in the test process.

A block with ``await`` outside a function runs on one event loop the page keeps, the way the
asyncio REPL (``python -m asyncio``) runs it; other blocks run as plain statements, so an
``asyncio.run(main())`` in them starts its own loop, as in a script.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
import os
import sys
import traceback
import types
from typing import Any


def run_blocks(blocks: list[dict[str, str]]) -> dict[str, Any]:
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module  # dataclasses and pickling look names up here
    namespace = module.__dict__
    loop = asyncio.new_event_loop()
    printed: list[str] = []
    try:
        for block in blocks:
            out = io.StringIO()
            try:
                code = compile(
                    block["source"], block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                )
                with contextlib.redirect_stdout(out):
                    if code.co_flags & inspect.CO_COROUTINE:
                        loop.run_until_complete(eval(code, namespace))
                    else:
                        exec(code, namespace)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    return {"printed": printed, "failed": block["where"], "error": repr(exc)}
            except BaseException:
                return {
                    "printed": printed,
                    "failed": block["where"],
                    "error": traceback.format_exc(),
                }
            printed.append(out.getvalue())
    finally:
        loop.close()
    return {"printed": printed, "failed": None, "error": None}


def main() -> None:
    report = run_blocks(json.load(sys.stdin))
    with open(sys.argv[1], "w") as out:
        json.dump(report, out)
    # A store a block left open (SQLite's connection thread is not a daemon) must not keep
    # the process alive once the page is done: the report is what counts.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
