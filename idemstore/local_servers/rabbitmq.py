"""Start a RabbitMQ node on loopback, as a plain process of ours (never the system service).

Everything the node would otherwise share with a system RabbitMQ is private: its node name,
its database and logs (a temporary directory), its AMQP, distribution and epmd ports (free
loopback ports), its Erlang cookie (``HOME``), its plugins (none). Every listener binds
127.0.0.1. The node takes a few seconds to boot: start one per test session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from idemstore.local_servers import (
    ServerUnavailableError,
    find_binary,
    free_port,
    wait_for_port,
)

__all__ = ["LocalRabbitMQ", "start_rabbitmq"]

# Debian's /usr/sbin/rabbitmq-server switches to the system user and the system's directories;
# the script it wraps runs as the caller with the environment below.
_SEARCH = ("/usr/lib/rabbitmq/bin",)


@dataclass
class LocalRabbitMQ:
    """A RabbitMQ node on 127.0.0.1:``port`` with its files in ``directory``."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    node: str
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n NODE ARGS`` against this node; its output."""
        rabbitmqctl = str(Path(_binary()).with_name("rabbitmqctl"))
        done = subprocess.run(
            [rabbitmqctl, "-n", self.node, "-q", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def stop(self) -> None:
        """Stop the node and everything it started (epmd included); idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        # epmd daemonizes into a session of its own: end it through its port's owner.
        _stop_epmd(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)


def _binary() -> str:
    for directory in _SEARCH:
        candidate = Path(directory) / "rabbitmq-server"
        if candidate.is_file():
            return str(candidate)
    found = find_binary("rabbitmq-server")
    if found is None:
        raise ServerUnavailableError(
            "rabbitmq-server is not on PATH (apt-get install rabbitmq-server)"
        )
    return found


def _stop_epmd(directory: Path) -> None:
    pid_file = directory / "epmd.port"
    if not pid_file.exists():
        return
    epmd = find_binary("epmd", "/usr/lib/erlang/erts-*/bin")
    if epmd is None:
        return
    env = {**os.environ, "ERL_EPMD_PORT": pid_file.read_text().strip()}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([epmd, "-kill"], env=env, capture_output=True, timeout=5, check=False)


def start_rabbitmq(*, timeout: float = 60.0) -> LocalRabbitMQ:
    """Boot a private node; ``ServerUnavailableError`` when it cannot."""
    binary = _binary()
    directory = Path(tempfile.mkdtemp(prefix="rabbitmq-"))
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    node = f"idem{uuid.uuid4().hex[:8]}@localhost"
    (directory / "enabled_plugins").write_text("[].\n")
    (directory / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{port}\n"
        "loopback_users = none\n"
        # The node must not refuse to accept messages on a small CI disk.
        "disk_free_limit.absolute = 1MB\n"
    )
    (directory / "epmd.port").write_text(str(epmd_port))
    (directory / "home").mkdir()
    env = {
        **os.environ,
        "HOME": str(directory / "home"),
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(directory / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
        "RABBITMQ_PID_FILE": str(directory / "rabbitmq.pid"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    log = directory / "server.log"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [binary],
            env=env,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LocalRabbitMQ(port=port, directory=directory, process=process, node=node, env=env)
    try:
        wait_for_port(port, process=process, timeout=timeout, log=log)
    except ServerUnavailableError:
        server.stop()
        raise
    return server
