"""Running one of the bench's own HTTP apps in a process of its own, on loopback.

The ``gateway`` scenario starts the mock MCP endpoint and the bare reverse proxy as
``python -m`` commands that take ``--port`` and one option of their own; both are served the
same way (uvicorn, quiet, no access log), so neither's share of the latency differs by setup.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["serve_on_loopback"]


def serve_on_loopback(
    argv: list[str] | None, app: Callable[[str], Any], option: str, option_help: str
) -> int:
    """Parse ``--port`` and the required ``option`` from ``argv``, then serve ``app(value)``
    on 127.0.0.1 at that port until the process is stopped."""
    import uvicorn

    # Under ``python -m`` the module is named __main__; its spec keeps the dotted name.
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    parser = argparse.ArgumentParser(prog=f"python -m {spec.name}" if spec else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(option, required=True, help=option_help)
    args = parser.parse_args(argv)
    value = getattr(args, option.removeprefix("--").replace("-", "_"))
    config = uvicorn.Config(
        app(value),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        # "on": an app whose startup fails (the proxy's client) stops the process at once.
        lifespan="on",
        access_log=False,
    )
    uvicorn.Server(config).run()
    return 0
