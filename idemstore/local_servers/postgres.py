"""A throwaway PostgreSQL 15 (and a PgBouncer in front of it) on free loopback ports.

When running as root the cluster belongs to the ``postgres`` user (PostgreSQL refuses to run as
root) and both servers are started with ``runuser -u postgres``. Authentication is ``trust`` on
loopback: these servers are for tests and benchmarks only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from idemstore.local_servers import (
    ServerUnavailableError,
    find_binary,
    free_port,
    spawn,
    wait_for_port,
)

__all__ = [
    "PgBouncerServer",
    "PostgresServer",
    "start_pgbouncer",
    "start_postgres",
    "start_streaming_replica",
]

PG_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin")
SERVER_USER = "postgres"


def _as_server_user() -> bool:
    return os.geteuid() == 0


def _command(*argv: str) -> list[str]:
    """``argv`` run as the unprivileged server user when we are root."""
    if _as_server_user():
        return ["runuser", "-u", SERVER_USER, "--", *argv]
    return list(argv)


def _own(path: Path) -> None:
    if _as_server_user():
        entry = pwd.getpwnam(SERVER_USER)
        for item in (path, *path.rglob("*")):
            os.chown(item, entry.pw_uid, entry.pw_gid)


def _server_directory(prefix: str) -> Path:
    """A fresh temporary directory for a cluster and its socket, owned by the server user."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        (base / "sock").mkdir()
        base.chmod(0o755)
        _own(base)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return base


def _run_tool(bin_dir: Path, tool: str, *args: str) -> None:
    """Run PostgreSQL's ``tool`` as the server user; a failure is a ``ServerUnavailableError``
    with the end of what it wrote on stderr."""
    done = subprocess.run(_command(str(bin_dir / tool), *args), capture_output=True, check=False)
    if done.returncode != 0:
        raise ServerUnavailableError(
            f"{tool} failed:\n" + done.stderr.decode(errors="replace")[-2000:]
        )


def _check_user() -> None:
    if _as_server_user():
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise ServerUnavailableError(
                f"running as root needs a {SERVER_USER!r} user to own the cluster"
            ) from None
        if shutil.which("runuser") is None:
            raise ServerUnavailableError("running as root needs runuser (util-linux)")


def _signal_and_wait(
    process: subprocess.Popen[bytes],
    pid: int | None,
    timeout: float,
    signum: signal.Signals = signal.SIGINT,
) -> None:
    # The Popen child may be runuser, which does not forward every signal: signal the real
    # server process (its pid from the pid file) when we know it.
    target = pid if pid is not None else process.pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(target, signum)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for victim in {target, process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        process.wait(timeout=10)


class PostgresServer:
    """A running PostgreSQL cluster in a temporary directory.

    ``url`` connects as the ``postgres`` superuser to the ``postgres`` database. ``stop()``
    removes everything; ``restart()`` stops and starts it on the same port and data.
    ``settings`` are server parameters given on the command line (``-c name=value``).
    """

    __slots__ = (
        "_bin",
        "_log",
        "_process",
        "base",
        "data_dir",
        "environment",
        "host",
        "namespace",
        "port",
        "settings",
        "socket_dir",
    )

    def __init__(
        self, bin_dir: Path, base: Path, port: int, settings: dict[str, str] | None = None
    ) -> None:
        self._bin = bin_dir
        self.base = base
        self.settings = dict(settings or {})
        self.data_dir = base / "data"
        self.socket_dir = base / "sock"
        self._log = base / "postgres.log"
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None
        # Variables the server starts with besides ours (a test's libfaketime, say).
        self.environment: dict[str, str] = {}
        # A network namespace to run in (``ip netns exec``), listening on ``host`` there
        # (a partition test's veth address); the tools reach it on its Unix socket.
        self.namespace: str | None = None
        self.host = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"postgresql://{SERVER_USER}@{self.host}:{self.port}/postgres"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def _tools_host(self) -> str:
        """Where psql and pg_isready reach the server: its Unix socket from outside its
        network namespace."""
        return str(self.socket_dir) if self.namespace else "127.0.0.1"

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and block until it accepts queries."""
        if self.running:
            return
        variables = [f"{name}={value}" for name, value in self.environment.items()]
        inside = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        self._process = spawn(
            inside
            + _command(
                *(["env", *variables] if variables else []),
                str(self._bin / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-k",
                str(self.socket_dir),
                "-c",
                f"listen_addresses={self.host}",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=64MB",
                "-c",
                "log_min_messages=warning",
                *(f"-c{name}={value}" for name, value in self.settings.items()),
            ),
            self._log,
        )
        try:
            if self.namespace is None:
                wait_for_port(self.port, process=self._process, timeout=timeout, log=self._log)
            self._wait_ready(timeout)
        except BaseException:
            self.stop_process()
            raise

    def _wait_ready(self, timeout: float) -> None:
        # An open port is not enough: during startup the server answers "starting up".
        deadline = time.monotonic() + timeout
        isready = str(self._bin / "pg_isready")
        while time.monotonic() < deadline:
            done = subprocess.run(
                [isready, "-q", "-h", self._tools_host, "-p", str(self.port), "-U", SERVER_USER],
                check=False,
            )
            if done.returncode == 0:
                return
            if self._process is not None and self._process.poll() is not None:
                break
            time.sleep(0.05)
        tail = self._log.read_text(errors="replace")[-2000:] if self._log.exists() else ""
        raise ServerUnavailableError(f"PostgreSQL did not become ready:\n{tail}")

    def sql(self, query: str) -> str:
        """Run ``query`` with psql and return its unaligned output (for setup and checks)."""
        done = subprocess.run(
            [
                str(self._bin / "psql"),
                "-XAtq",
                "-h",
                self._tools_host,
                "-p",
                str(self.port),
                "-U",
                SERVER_USER,
                "-d",
                "postgres",
                "-c",
                query,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise ServerUnavailableError(f"psql {query!r} failed: {done.stderr}")
        return done.stdout.strip()

    def promote(self, timeout: float = 30.0) -> None:
        """Promote this standby to a primary (``pg_ctl promote``) and wait until it is one."""
        done = subprocess.run(
            _command(
                str(self._bin / "pg_ctl"),
                "promote",
                "-w",
                "-t",
                str(int(timeout)),
                "-D",
                str(self.data_dir),
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ServerUnavailableError(f"pg_ctl promote failed: {done.stdout}{done.stderr}")

    def stop_process(self, *, mode: str = "fast", timeout: float = 30.0) -> None:
        """Shut the server down, keeping its data.

        ``mode`` is PostgreSQL's: ``"fast"`` (checkpoint, then exit) or ``"immediate"`` (exit
        at once, as in a crash: the next start replays the WAL).
        """
        signum = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        if self._process is None:
            return
        if self._process.poll() is None:
            _signal_and_wait(self._process, self._postmaster_pid(), timeout, signum)
        self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop_process()
        self.start()

    def stop(self) -> None:
        """Shut down and delete the cluster."""
        self.stop_process()
        shutil.rmtree(self.base, ignore_errors=True)


def _bin_dir() -> Path:
    bin_dir_text = find_binary("initdb", *PG_BIN_DIRS)
    if bin_dir_text is None:
        raise ServerUnavailableError(
            "PostgreSQL binaries (initdb, postgres) not found on PATH or in "
            "/usr/lib/postgresql/*/bin: apt-get install postgresql"
        )
    # Resolve symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb): postgres
    # and pg_isready live beside the real initdb.
    return Path(bin_dir_text).resolve().parent


def start_postgres(
    *, port: int | None = None, settings: dict[str, str] | None = None
) -> PostgresServer:
    """initdb a fresh cluster in a temporary directory and start it on 127.0.0.1.

    ``settings`` are server parameters, e.g. ``{"synchronous_standby_names": "*"}`` for a
    primary that waits for its standby (see ``start_streaming_replica``).
    """
    bin_dir = _bin_dir()
    _check_user()
    base = _server_directory("idemstore-pg-")
    try:
        _run_tool(
            bin_dir,
            "initdb",
            "-D",
            str(base / "data"),
            "-U",
            SERVER_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        server = PostgresServer(bin_dir, base, port or free_port(), settings)
        server.start()
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return server


_STANDBY_READY = """
    SELECT count(*) FROM pg_stat_replication
    WHERE state = 'streaming'
      AND (sync_state IN ('sync', 'quorum') OR current_setting('synchronous_standby_names') = '')
"""


def start_streaming_replica(
    primary: PostgresServer, *, upstream_port: int | None = None, timeout: float = 60.0
) -> PostgresServer:
    """A hot standby of ``primary`` on a free loopback port, streaming its WAL.

    ``pg_basebackup -R`` copies the primary and writes the standby's connection settings; this
    returns once the primary reports the standby streaming. ``promote()`` makes it a primary.
    With ``upstream_port`` the standby streams from that loopback port instead of the
    primary's (a proxy in front of the primary, to cut the standby off).
    """
    bin_dir = _bin_dir()
    _check_user()
    base = _server_directory("idemstore-pg-replica-")
    replica: PostgresServer | None = None
    try:
        _run_tool(
            bin_dir,
            "pg_basebackup",
            "-D",
            str(base / "data"),
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            SERVER_USER,
        )
        if upstream_port is not None:
            settings = base / "data" / "postgresql.auto.conf"
            text = settings.read_text()
            if f"port={primary.port}" not in text:
                raise ServerUnavailableError("pg_basebackup -R wrote no primary_conninfo port")
            settings.write_text(text.replace(f"port={primary.port}", f"port={upstream_port}"))
        # A standby of a synchronous primary must not itself wait for a standby once promoted
        # in a test that has no other: it starts without the primary's settings.
        replica = PostgresServer(bin_dir, base, free_port())
        replica.start()
        deadline = time.monotonic() + timeout
        # Streaming, and counted as synchronous when the primary names synchronous standbys
        # (a standby streams as "async" for a moment first).
        while primary.sql(_STANDBY_READY) in ("", "0"):
            if time.monotonic() > deadline:
                raise ServerUnavailableError(f"the standby never streamed within {timeout}s")
            time.sleep(0.1)
    except BaseException:
        if replica is not None:
            replica.stop()
        shutil.rmtree(base, ignore_errors=True)
        raise
    return replica


class PgBouncerServer:
    """A running PgBouncer; ``url`` reaches the target database through it."""

    __slots__ = ("_argv", "_log", "_process", "base", "database", "port", "user")

    def __init__(
        self,
        base: Path,
        port: int,
        argv: list[str],
        user: str,
        database: str,
    ) -> None:
        self.base = base
        self.port = port
        self._argv = argv
        self._log = base / "pgbouncer.log"
        self.user = user
        self.database = database
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        """Start (or start again) PgBouncer on its port with its configuration."""
        self._process = spawn(self._argv, self.base / "stdout.log")
        wait_for_port(self.port, process=self._process, timeout=30, log=self._log)

    def shutdown(self, signum: signal.Signals = signal.SIGINT) -> None:
        """Stop the process (SIGINT: safe shutdown, SIGTERM: immediate, SIGKILL: a crash);
        ``start`` brings it back on the same port."""
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.base / "pgbouncer.pid").read_text().strip())
        if self._process is not None and self._process.poll() is None:
            _signal_and_wait(self._process, pid, 30.0, signum)

    def stop(self) -> None:
        self.shutdown()
        shutil.rmtree(self.base, ignore_errors=True)


def start_pgbouncer(
    target_host: str,
    target_port: int,
    *,
    user: str = SERVER_USER,
    password: str | None = None,
    database: str = "postgres",
    pool_mode: str = "transaction",
    pool_size: int = 40,
) -> PgBouncerServer:
    """Start PgBouncer on a free loopback port in front of ``target_host:target_port``.

    Clients connect without a password (``auth_type = trust``); PgBouncer logs in to the server
    as ``user`` with ``password`` when one is given.
    """
    binary = find_binary("pgbouncer", "/usr/sbin", "/usr/local/bin")
    if binary is None:
        raise ServerUnavailableError("pgbouncer not found on PATH: apt-get install pgbouncer")
    _check_user()
    base = Path(tempfile.mkdtemp(prefix="idemstore-pgbouncer-"))
    port = free_port()
    server_login = f"user={user}" + (f" password={password}" if password else "")
    (base / "userlist.txt").write_text(f'"{user}" ""\n')
    (base / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={target_host} port={target_port} {server_login}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {base / 'userlist.txt'}",
                f"pool_mode = {pool_mode}",
                f"default_pool_size = {pool_size}",
                "max_client_conn = 1000",
                f"pidfile = {base / 'pgbouncer.pid'}",
                f"logfile = {base / 'pgbouncer.log'}",
                "ignore_startup_parameters = extra_float_digits,statement_timeout",
                "",
            ]
        )
    )
    base.chmod(0o755)
    _own(base)
    bouncer = PgBouncerServer(
        base, port, _command(binary, str(base / "pgbouncer.ini")), user, database
    )
    try:
        bouncer.start()
    except BaseException:
        bouncer.stop()
        raise
    return bouncer
