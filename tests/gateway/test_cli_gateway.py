"""``idemstore gateway`` on the command line: what it says when it cannot start."""

from __future__ import annotations

import subprocess
import sys

from tests.loopback_process import ENV, ROOT

# Runs the real CLI in a process where httpx cannot be imported (as without the extra).
WITHOUT_HTTPX = """
import sys
sys.modules["httpx"] = None
from idemstore.cli import main
raise SystemExit(main(["gateway", "--listen", "127.0.0.1:1", "--upstream", "http://127.0.0.1:2/mcp"]))
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=ENV, cwd=ROOT, check=False
    )


def test_without_the_extra_the_error_names_the_pip_line() -> None:
    done = _run("-c", WITHOUT_HTTPX)
    assert done.returncode == 2
    assert "pip install '.[gateway]' (in idemstore's checkout)" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_upstream_or_listen_address_is_one_clear_line() -> None:
    bad_upstream = _run(
        "-m", "idemstore", "gateway", "--listen", "127.0.0.1:1", "--upstream", "ftp://x/mcp"
    )
    assert bad_upstream.returncode == 2
    assert "--upstream must be an http(s) URL" in bad_upstream.stderr
    bad_listen = _run(
        "-m", "idemstore", "gateway", "--listen", "nowhere", "--upstream", "http://h/mcp"
    )
    assert bad_listen.returncode == 2
    assert "--listen wants HOST:PORT" in bad_listen.stderr
    assert "Traceback" not in bad_upstream.stderr + bad_listen.stderr


def test_a_verified_caller_stands_alone() -> None:
    done = _run(
        "-m", "idemstore", "gateway", "--listen", "127.0.0.1:1", "--upstream", "http://h/mcp",
        "--caller", "jwt:sub", "--caller", "header:authorization", "--jwks", "https://i/jwks",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--caller jwt:CLAIM stands alone" in done.stderr
    assert "Traceback" not in done.stderr


# The same, where PyJWT cannot be imported: a verified caller names the extra that brings it.
WITHOUT_PYJWT = """
import sys
sys.modules["jwt"] = None
from idemstore.cli import main
raise SystemExit(main([
    "gateway", "--listen", "127.0.0.1:1", "--upstream", "http://127.0.0.1:2/mcp",
    "--caller", "jwt:sub", "--jwks", "https://issuer.test/jwks",
    "--jwt-issuer", "https://issuer.test", "--jwt-audience", "https://gateway.test/mcp",
]))
"""


def test_a_verified_caller_without_pyjwt_names_the_pip_line() -> None:
    done = _run("-c", WITHOUT_PYJWT)
    assert done.returncode == 2
    assert "pip install '.[gateway]'" in done.stderr
    assert "Traceback" not in done.stderr
