"""Every code block of README.md and docs/ runs as written, or says why it cannot.

Per page, in the page's order and in one working directory (a fresh temporary one):

- Python blocks run in one process and one namespace (tests/docs/python_blocks_runner.py);
  ``await`` outside a function runs on an event loop, as in ``python -m asyncio``. A block
  marked ``<!-- standalone -->`` says it runs as it stands: it gets a fresh process of its own,
  with nothing the blocks before it defined.
- Python blocks that define ``test_*`` functions run under pytest, as the reader's project would
  (a test of their own, in the slow lane: each starts pytest and its engines anew).
- ``bash`` blocks made of cheap ``idemstore`` commands (``migrate``, ``inspect``, ``stats``, one
  ``sweep`` pass) run through the CLI's ``main()`` in this process; each must exit 0.
- ``bash`` blocks that only install the checkout (``pip install '.[extra]'``) are checked, not
  run: each extra must exist in pyproject.toml (installing takes minutes and an index).
- ``console`` blocks of ``$ idemstore …`` commands run one by one; what each prints must match
  the page, where ``…`` stands for anything and times and tokens are not compared.
- ``console`` blocks that show ``--help`` match the parser (tests/docs/cli_help.py).
- Anything else needs a marker comment (tests/docs/markdown_blocks.py): not runnable with a
  reason, or tested by another test.

Store URLs are placeholders: the harness points each at a store of the test engines (a fresh
PostgreSQL schema, a fresh DynamoDB table, a Redis prefix, an SQLite file); relative SQLite
paths land in the page's working directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

import pytest

from idemstore.cli import main
from tests.docs.cli_help import expected_lines, help_command, shown_lines
from tests.docs.markdown_blocks import ROOT, Block, blocks_of, doc_pages

if TYPE_CHECKING:
    from pathlib import Path

PAGES = doc_pages()
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
CHEAP_COMMANDS = ("migrate", "inspect", "stats", "sweep", "options")
# A Python block the page says runs as it stands: run alone, in a process of its own.
STANDALONE = "standalone"
MARKERS = ("not-runnable", "tested-by", "example", "output", STANDALONE)

_STORE_URL = re.compile(
    r"(?:postgresql|postgres|redis\+cluster|rediss|redis|dynamodb)://[^\s'\"`)]*"
    r"|sqlite:////[^\s'\"`)]*"  # an absolute SQLite path: /var/lib/... is not ours to write
)
_PIP_INSTALL = re.compile(r"(?:^|&&\s*|\s)(?:\S*/)?pip3? install\s+(?P<args>[^&;#\n]*)")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")
_TEST_FUNCTION = re.compile(r"^(?:async )?def test_", re.MULTILINE)
_STATUS_LINE = re.compile(r"^(HTTP/[\d.]+ \d{3}) .*$")
_TOKEN = re.compile(r"\b[0-9a-f]{32}\b")


def commands_of(source: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", source)
    commands = []
    for line in joined.splitlines():
        command = re.sub(r"(^|\s)#.*$", "", line).strip()
        if command:
            commands.append(command)
    return commands


def is_cheap_cli(command: str) -> bool:
    words = command.split()
    return (
        len(words) >= 2
        and words[0] == "idemstore"
        and words[1] in CHEAP_COMMANDS
        and "--every" not in words
    )


def pip_installs(block: Block) -> list[list[str]]:
    """The arguments of each ``pip install`` a block runs (shell words, options included); in
    a console block only its ``$`` lines are run (a command's output may name the install
    line of a published package)."""
    source = block.source
    if block.lang == "console":
        source = "\n".join(line[2:] for line in source.splitlines() if line.startswith("$ "))
    joined = re.sub(r"\\\n\s*", " ", source)
    return [shlex.split(found["args"]) for found in _PIP_INSTALL.finditer(joined)]


def installs_the_checkout(command: str) -> bool:
    """``pip install`` of this checkout only (``.``, ``'.[extra]'``, ``-e``, ``-q``)."""
    return bool(re.match(r"^(?:\S*/)?pip3? install\s", command)) and all(
        arg.startswith(("-", ".")) for arg in shlex.split(command)[2:]
    )


def how_checked(block: Block) -> str:
    """What the harness does with a block; "unmarked" fails the page."""
    if block.marker in ("not-runnable", "tested-by", "example", "output"):
        return block.marker
    if block.lang in PYTHON:
        return "pytest" if _TEST_FUNCTION.search(block.source) else "python"
    if help_command(block) is not None:
        return "help"
    if block.lang == "console":
        lines = [line for line in block.source.splitlines() if line.startswith("$ ")]
        if lines and all(is_cheap_cli(line[2:]) for line in lines):
            return "console"
    if block.lang in SHELL:
        commands = commands_of(block.source)
        if commands and all(is_cheap_cli(c) or installs_the_checkout(c) for c in commands):
            return "shell" if any(is_cheap_cli(c) for c in commands) else "install"
    return "unmarked"


class Stores:
    """The engines' stores behind a page's store URLs, made the first time a page needs one."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._made: dict[str, str] = {}
        self.dynamodb_tables: set[tuple[str, str]] = set()  # (table, region), for the cleanup

    def _make(self, kind: str) -> str:
        fixture = self._request.getfixturevalue
        if kind == "postgres":
            # a fresh schema, not migrated: the page's own `idemstore migrate` does that
            server = fixture("postgres_server")
            return f"{server}{'&' if '?' in server else '?'}schema={fixture('postgres_schema')}"
        if kind == "dynamodb":
            return str(fixture("dynamodb_endpoint"))
        if kind == "redis":
            return str(fixture("redis_store_url"))
        return str(fixture("sqlite_file_store_url"))

    def url_for(self, url: str) -> str:
        kind = url.split("://", 1)[0].split("+")[0].rstrip("s")
        kind = {"postgresql": "postgres", "redi": "redis"}.get(kind, kind)
        if kind == "dynamodb":
            # The page's own table and region, on the test endpoint: what it prints names them.
            if kind not in self._made:
                self._made[kind] = self._make(kind)
            parsed = urlsplit(url)
            region = dict(parse_qsl(parsed.query)).get("region", "us-east-1")
            self.dynamodb_tables.add((parsed.netloc, region))
            return f"{url}{'&' if parsed.query else '?'}endpoint_url={self._made[kind]}"
        if kind not in self._made:
            self._made[kind] = self._make(kind)
        return self._made[kind]

    def drop_dynamodb_tables(self) -> None:
        """Pages share the session's endpoint and name the same tables: each starts afresh."""
        if not self.dynamodb_tables:
            return
        import boto3

        endpoint = self._made["dynamodb"]
        for table, region in self.dynamodb_tables:
            client = boto3.client("dynamodb", region_name=region, endpoint_url=endpoint)
            with contextlib.suppress(client.exceptions.ResourceNotFoundException):
                client.delete_table(TableName=table)

    def fill(self, source: str, *, shell: bool) -> str:
        def replace(found: re.Match[str]) -> str:
            new = self.url_for(found[0])
            quoted = found.start() > 0 and source[found.start() - 1] in "'\""
            return new if quoted or not shell else shlex.quote(new)

        return _STORE_URL.sub(replace, source)


@pytest.fixture
def reader_env(tmp_path: Path) -> dict[str, str]:
    """What a reader's environment has after installing the checkout: `idemstore` on PATH.
    (Added to os.environ when a block runs: engine fixtures set credentials there.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "idemstore"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m idemstore "$@"\n')
    shim.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "80",
    }


def normalized(text: str) -> str:
    # A status line's reason phrase is the server's Python's (3.13 renamed 422 "Unprocessable
    # Content"): the code is what the page promises.
    text = _STATUS_LINE.sub(r"\1", text)
    return _TOKEN.sub("<token>", _TIMESTAMP.sub("<time>", text))


def matches_page(shown: list[str], printed: list[str]) -> bool:
    if len(shown) != len(printed):
        return False
    for want, got in zip(shown, printed, strict=True):
        pattern = ".*".join(re.escape(part) for part in normalized(want).split("…"))
        if not re.fullmatch(pattern, normalized(got).rstrip()):
            return False
    return True


def run_module(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV`` in ``cwd`` with ``env`` over this process's environment, as a
    reader would run it; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def run_python(blocks: list[Block], stores: Stores, cwd: Path, env: dict[str, str]) -> list[str]:
    """Run a page's Python blocks in order; what each printed."""
    report = cwd.parent / "python-report.json"
    sources = [{"where": b.where, "source": stores.fill(b.source, shell=False)} for b in blocks]
    done = run_module(
        ["tests.docs.python_blocks_runner", str(report)], cwd, env, json.dumps(sources)
    )
    assert report.exists(), f"the Python blocks' runner died:\n{done.stdout}\n{done.stderr}"
    result = json.loads(report.read_text())
    assert result["failed"] is None, f"{result['failed']} failed:\n{result['error']}"
    return list(result["printed"])


def run_cli(command: str, cwd: Path, variables: dict[str, str]) -> tuple[int, list[str]]:
    """``idemstore ARGS`` run in this process (no interpreter to start: the docs tests stay
    fast), in ``cwd``, with ``$NAME`` taken from ``variables``; its status and output lines."""
    command = re.sub(r"\$\{?(\w+)\}?", lambda v: variables.get(v[1], v[0]), command)
    argv = shlex.split(command)
    assert argv[0] == "idemstore", command
    out = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = main(argv[1:])
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 2
    return status, out.getvalue().rstrip("\n").splitlines()


def run_console(block: Block, stores: Stores, cwd: Path) -> None:
    """Each `$ idemstore …` line run; its output compared with the lines under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.source.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    for command, shown in steps:
        _, printed = run_cli(stores.fill(command, shell=True), cwd, {})
        assert matches_page(shown, printed), (
            f"{block.where}: `{command}` printed\n"
            + "\n".join(printed)
            + "\nthe page shows\n"
            + "\n".join(shown)
        )


def run_shell(block: Block, stores: Stores, cwd: Path) -> None:
    """A block of cheap idemstore commands (and installs of the checkout, checked only)."""
    check_installs(block)  # checked, not run: the test run has the checkout installed
    variables = {"IDEMSTORE_URL": stores.url_for("sqlite:////docs.db")}
    for command in commands_of(block.source):
        if installs_the_checkout(command):
            continue
        status, printed = run_cli(stores.fill(command, shell=True), cwd, variables)
        assert status == 0, f"{block.where}: `{command}` exited {status}:\n" + "\n".join(printed)


def run_pytest(block: Block, cwd: Path, env: dict[str, str]) -> None:
    """A block of tests, run by pytest as a reader's project would (the idemstore.testing
    plugin loads itself and gives the engines' fixtures; asyncio_mode = auto, as the page says)."""
    test_file = cwd / f"test_docs_block_{block.line}.py"
    test_file.write_text(block.source)
    done = run_module(
        [
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "--rootdir",
            str(cwd),
            str(test_file),
        ],
        cwd,
        env,
    )
    assert done.returncode == 0, f"{block.where}: its tests failed:\n{done.stdout}\n{done.stderr}"


def check_installs(block: Block) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for args in pip_installs(block):
        for arg in args:
            found = re.fullmatch(r"\.\[(?P<extras>[\w,-]+)\]", arg)
            if found:
                unknown = set(found["extras"].split(",")) - set(extras)
                assert not unknown, f"{block.where}: no extra {sorted(unknown)} in pyproject.toml"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_block_of_the_page_runs_or_says_why_not(
    page: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    reader_env: dict[str, str],
) -> None:
    blocks = blocks_of(page)
    unmarked = [b.where for b in blocks if how_checked(b) == "unmarked"]
    assert not unmarked, (
        "blocks neither run by the docs tests nor marked `<!-- not-runnable: why -->` "
        f"or `<!-- tested-by: tests/... -->`: {unmarked}"
    )
    stores = Stores(request)
    request.addfinalizer(stores.drop_dynamodb_tables)
    cwd = tmp_path / "work"
    cwd.mkdir()
    # In the page's order: consecutive Python blocks run in one process (one namespace); a
    # shell or console block between them runs after the ones before it (a page may migrate,
    # then open the store). Output blocks are compared once everything ran.
    python_run: list[Block] = []
    printed_by: dict[int, str] = {}
    last_python: Block | None = None

    def flush_python() -> None:
        if python_run:
            printed = run_python(python_run, stores, cwd, reader_env)
            for block, out in zip(python_run, printed, strict=True):
                printed_by[block.line] = out
            python_run.clear()

    pending_output: list[tuple[Block, Block]] = []
    for block in blocks:
        how = how_checked(block)
        if how == "python":
            if block.marker == STANDALONE:
                flush_python()
            python_run.append(block)
            last_python = block
            if block.marker == STANDALONE:
                flush_python()
            continue
        if how == "output":
            assert last_python is not None, f"{block.where}: an output block after no Python"
            pending_output.append((block, last_python))
            continue
        if how in ("shell", "console"):
            flush_python()
            (run_shell if how == "shell" else run_console)(block, stores, cwd)
        elif how == "install":
            check_installs(block)
        elif how == "help":
            command = help_command(block)
            assert command is not None
            assert shown_lines(block) == expected_lines(block, command), (
                f"{block.where}: `idemstore {command} --help` changed; rewrite the docs' help "
                "blocks with `PYTHONPATH=. python -m tests.docs.cli_help --write`"
            )
    flush_python()
    for output, source in pending_output:
        shown = output.source.rstrip("\n").splitlines()
        printed = printed_by[source.line].rstrip("\n").splitlines()
        assert matches_page(shown, printed), (
            f"{output.where}: {source.where} printed\n" + "\n".join(printed)
        )


def test_every_marker_is_complete() -> None:
    """A block left unrun says why, and one run elsewhere names a test that reads its page."""
    problems = []
    for page in PAGES:
        for block in blocks_of(page):
            if block.marker and block.marker not in MARKERS:
                problems.append(f"{block.where}: unknown marker {block.marker!r}")
            if block.marker == STANDALONE and block.lang not in PYTHON:
                problems.append(f"{block.where}: only a Python block can be standalone")
            if block.marker == "not-runnable" and not block.marker_value:
                problems.append(f"{block.where}: not-runnable without a reason")
            if block.marker == "tested-by":
                test = ROOT / block.marker_value.split("::")[0]
                if not test.is_file() or page.name not in test.read_text():
                    problems.append(
                        f"{block.where}: {block.marker_value} does not read {page.name}"
                    )
            if block.marker == "example":
                test = ROOT / "tests" / "mcp_server" / "test_docs_example.py"
                if f'"{block.marker_value}"' not in test.read_text():
                    problems.append(f"{block.where}: no test runs example {block.marker_value}")
    assert not problems, problems


def test_install_lines_install_the_checkout_with_extras_it_has() -> None:
    """The package is not on an index yet: `pip install 'idemstore[…]'` would fail."""
    problems = []
    for page in PAGES:
        for block in blocks_of(page):
            for args in pip_installs(block):
                if any(re.match(r"idemstore\b", arg) for arg in args):
                    problems.append(f"{block.where}: installs idemstore from an index")
            check_installs(block)
    assert not problems, problems


PYTEST_BLOCKS = [b for page in PAGES for b in blocks_of(page) if how_checked(b) == "pytest"]


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTEST_BLOCKS, ids=lambda b: b.where)
def test_blocks_of_tests_pass_under_pytest(
    block: Block, tmp_path: Path, reader_env: dict[str, str]
) -> None:
    run_pytest(block, tmp_path, reader_env)
