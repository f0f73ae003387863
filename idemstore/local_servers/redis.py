"""Start ``redis-server`` on loopback: one node, a 3-node Redis Cluster, or a primary with
replicas watched by three Sentinels.

Each node runs in its own temporary directory on a free 127.0.0.1 port. Besides ``stop`` (for
good), a node can be shut down (gracefully or with SIGKILL) and started again on the same port
and directory, or paused (SIGSTOP, to look like a hung server): what the fault and durability
tests need.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from idemstore.local_servers import ServerUnavailableError, find_binary, free_port, wait_for_port

__all__ = [
    "LocalRedis",
    "LocalRedisCluster",
    "LocalRedisSentinel",
    "start_redis",
    "start_redis_cluster",
    "start_redis_sentinel",
]


def _binary(name: str) -> str:
    found = find_binary(name)
    if found is None:
        raise ServerUnavailableError(f"{name} is not on PATH (apt-get install redis-server)")
    return found


@dataclass
class LocalRedis:
    """One ``redis-server`` process on 127.0.0.1:``port`` with its data in ``directory``."""

    port: int
    directory: Path
    appendonly: bool = False
    appendfsync: str = "everysec"
    cluster: bool = False
    cluster_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    owns_directory: bool = True
    # A replica of the primary on this port (``--replicaof``).
    replica_of: int | None = None
    # Run as a Sentinel with this configuration (written once: Sentinel rewrites its file).
    sentinel_config: str | None = None
    # The password of the default user (``--requirepass``); ``cli`` gives it.
    requirepass: str | None = None
    # Variables the server starts with besides ours (a test's clock shim, say).
    environment: dict[str, str] = field(default_factory=dict)
    # A network namespace to run in (``ip netns exec``, a partition test's), listening on
    # ``host`` and ``also_bind`` there; ``replica_of`` is then on ``replica_of_host``.
    namespace: str | None = None
    host: str = "127.0.0.1"
    also_bind: tuple[str, ...] = ()
    replica_of_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        # redis-server changes into --dir before it opens --logfile: a relative directory
        # would be looked up a second time from inside itself, and the server exit at once.
        self.directory = Path(self.directory).resolve()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def _argv(self) -> list[str]:
        if self.sentinel_config is not None:
            config = self.directory / "sentinel.conf"
            if not config.exists():
                config.write_text(
                    f"port {self.port}\nbind {self.host}\ndir {self.directory}\n"
                    f"protected-mode {'no' if self.namespace else 'yes'}\n"
                    f"logfile {self.log}\ndaemonize no\n{self.sentinel_config}"
                )
            return [_binary("redis-server"), str(config), "--sentinel"]
        argv = [
            _binary("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            *self.also_bind,
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.log),
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            # A replica's full sync starts at once (Redis 7 waits 5 s for more replicas).
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.cluster:
            assert self.cluster_port is not None
            argv += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                str(self.cluster_port),
                "--cluster-node-timeout",
                "2000",
            ]
        if self.replica_of is not None:
            argv += ["--replicaof", self.replica_of_host, str(self.replica_of)]
        if self.requirepass is not None:
            argv += ["--requirepass", self.requirepass]
        if self.namespace is not None:
            # Reached from other namespaces (a test's own, private): not loopback.
            argv += ["--protected-mode", "no"]
        return argv

    def start(self) -> None:
        """Start (or restart) the server on the same port and directory; wait until it answers."""
        if self.running:
            return
        inside = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        self.process = subprocess.Popen(
            inside + self._argv(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **self.environment} if self.environment else None,
        )
        if self.namespace is None:
            wait_for_port(self.port, process=self.process, timeout=20, log=self.log)
        # A port that accepts connections may still be loading the AOF: wait for PONG.
        deadline = time.monotonic() + 20
        while self.cli("PING", check=False).strip() != "PONG":
            if time.monotonic() > deadline:
                raise ServerUnavailableError(f"redis on port {self.port} never answered PING")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cli(self, *args: str, check: bool = True) -> str:
        """Run ``redis-cli -p PORT ARGS...`` and return its output."""
        inside = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        done = subprocess.run(
            [*inside, _binary("redis-cli"), "-h", self.host, "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=30,
            env=self._cli_environment(),
        )
        if check and done.returncode != 0:
            raise ServerUnavailableError(f"redis-cli {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    def _cli_environment(self) -> dict[str, str] | None:
        if self.requirepass is None:
            return None
        # Not on argv, where redis-cli warns of it (and ps shows it).
        return {**os.environ, "REDISCLI_AUTH": self.requirepass}

    def shutdown(self, *, kill: bool = False) -> None:
        """Stop the process but keep its data: SIGTERM (a clean shutdown) or, with ``kill``,
        SIGKILL (a crash). ``start`` brings it back on the same port."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a paused server cannot shut down
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or crash, with ``kill``) and start again with the same data directory."""
        self.shutdown(kill=kill)
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets open but answers nothing (a hung server)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server for good and remove its directory (when it made one)."""
        self.shutdown()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_redis(
    *,
    appendonly: bool = False,
    appendfsync: str = "everysec",
    directory: Path | None = None,
    requirepass: str | None = None,
) -> LocalRedis:
    """A running single ``redis-server`` on a free loopback port.

    ``appendonly=True, appendfsync="always"`` makes every acknowledged write survive a crash
    of the server process (the durability tests use that). With ``requirepass`` the server
    refuses clients that do not give that password (its ``url`` gives none).
    """
    if appendfsync not in ("always", "everysec", "no"):
        raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
    owns = directory is None
    where = Path(tempfile.mkdtemp(prefix="idemstore-redis-")) if directory is None else directory
    where.mkdir(parents=True, exist_ok=True)
    server = LocalRedis(
        port=free_port(),
        directory=where,
        appendonly=appendonly,
        appendfsync=appendfsync,
        owns_directory=owns,
        requirepass=requirepass,
    )
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class LocalRedisCluster:
    """Several cluster-enabled ``redis-server`` nodes joined into one cluster, each primary
    with ``replicas`` replicas (none by default)."""

    nodes: list[LocalRedis] = field(default_factory=list)
    directory: Path | None = None

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.address for node in self.nodes)

    def state_ok(self) -> bool:
        """Whether every running node reports ``cluster_state:ok``."""
        for node in self.nodes:
            if not node.running or "cluster_state:ok" not in node.cli("CLUSTER", "INFO"):
                return False
        return True

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.state_ok():
            if time.monotonic() > deadline:
                raise ServerUnavailableError(f"cluster state not ok within {timeout}s")
            time.sleep(0.1)

    def role_of(self, node: LocalRedis) -> str:
        """``master`` or ``slave`` as ``node`` reports itself now (``""`` if it does not answer)."""
        for line in node.cli("INFO", "replication", check=False).splitlines():
            if line.startswith("role:"):
                return line.partition(":")[2].strip()
        return ""

    def replicas_of(self, primary: LocalRedis) -> list[LocalRedis]:
        """The running nodes that replicate ``primary`` with their link up."""
        following = f"master_port:{primary.port}"
        return [
            node
            for node in self.nodes
            if node is not primary
            and node.running
            and following in (text := node.cli("INFO", "replication", check=False))
            and "master_link_status:up" in text
        ]

    def wait_replicas_linked(self, replicas: int, timeout: float = 30.0) -> None:
        """Wait until every primary has ``replicas`` replicas with their link up."""
        deadline = time.monotonic() + timeout
        while True:
            primaries = [n for n in self.nodes if n.running and self.role_of(n) == "master"]
            if primaries and all(len(self.replicas_of(p)) >= replicas for p in primaries):
                return
            if time.monotonic() > deadline:
                raise ServerUnavailableError(f"cluster replicas not linked within {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every node for good and remove their directories."""
        for node in self.nodes:
            node.shutdown()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_redis_cluster(
    *, nodes: int = 3, appendonly: bool = False, replicas: int = 0
) -> LocalRedisCluster:
    """A running Redis Cluster of ``nodes`` primaries, each with ``replicas`` replicas
    (``redis-cli --cluster create``). A replica takes over when its primary has been
    unreachable for the node timeout (2 s here)."""
    if nodes < 3:
        raise ValueError("a Redis Cluster needs at least 3 primaries")
    if replicas < 0:
        raise ValueError(f"replicas must be 0 or more, not {replicas}")
    root = Path(tempfile.mkdtemp(prefix="idemstore-redis-cluster-"))
    cluster = LocalRedisCluster(directory=root)
    try:
        for index in range(nodes * (1 + replicas)):
            where = root / f"node{index}"
            where.mkdir()
            node = LocalRedis(
                port=free_port(),
                directory=where,
                appendonly=appendonly,
                cluster=True,
                # The bus port defaults to port + 10000, which may be taken or out of range.
                cluster_port=free_port(),
                owns_directory=False,
            )
            cluster.nodes.append(node)
            node.start()
        created = subprocess.run(
            [
                _binary("redis-cli"),
                "--cluster",
                "create",
                *(node.address for node in cluster.nodes),
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise ServerUnavailableError(f"redis-cli --cluster create failed: {created.stdout}")
        cluster.wait_ok()
        if replicas:
            cluster.wait_replicas_linked(replicas)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@dataclass
class LocalRedisSentinel:
    """A primary and its replicas, watched by Sentinels that fail over under ``service``."""

    primary: LocalRedis
    replicas: list[LocalRedis]
    sentinels: list[LocalRedis]
    service: str
    directory: Path

    @property
    def url(self) -> str:
        addresses = ",".join(sentinel.address for sentinel in self.sentinels)
        return f"redis+sentinel://{addresses}/{self.service}"

    @property
    def nodes(self) -> list[LocalRedis]:
        """The data nodes: the first primary and its replicas (roles change on failover)."""
        return [self.primary, *self.replicas]

    def _named_primaries(self) -> list[int | None]:
        """The primary's port as each running Sentinel names it (``None``: no answer)."""
        named: list[int | None] = []
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            out = sentinel.cli(
                "SENTINEL", "get-master-addr-by-name", self.service, check=False
            ).split()
            named.append(int(out[1]) if len(out) == 2 and out[1].isdigit() else None)
        return named

    def primary_port(self) -> int | None:
        """The port the Sentinels now name as primary, or ``None`` when none answers."""
        return next((port for port in self._named_primaries() if port is not None), None)

    def sentinels_agree_on(self, port: int) -> bool:
        """Whether every running Sentinel names ``port`` as the primary."""
        return all(named == port for named in self._named_primaries())

    def node_on(self, port: int) -> LocalRedis:
        return next(node for node in self.nodes if node.port == port)

    def wait_replicas_synced(self, timeout: float = 30.0) -> None:
        """Block until the current primary reports every running replica online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None:
                info = self.node_on(port).cli("INFO", "replication", check=False)
                online = info.count("state=online")
                if online >= sum(1 for n in self.nodes if n.running and n.port != port):
                    return
            time.sleep(0.1)
        raise ServerUnavailableError(f"replicas not in sync within {timeout}s")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.replicas, self.primary]:
            node.shutdown()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_redis_sentinel(
    *,
    replicas: int = 1,
    sentinels: int = 3,
    service: str = "idemstore",
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    appendonly: bool = True,
    appendfsync: str = "everysec",
) -> LocalRedisSentinel:
    """A primary with ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority)
    monitoring it as ``service``; a primary that stops answering for ``down_after_ms`` is
    failed over to a replica.

    Every data node keeps an AOF (``appendfsync`` as given) unless ``appendonly=False``:
    without it, a primary restarted before Sentinel fails it over comes back empty and its
    replicas drop everything on resync (what a store with ``wait_replicas`` refuses)."""
    if appendfsync not in ("always", "everysec", "no"):
        raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
    root = Path(tempfile.mkdtemp(prefix="idemstore-redis-sentinel-"))

    def node(name: str, **options: object) -> LocalRedis:
        where = root / name
        where.mkdir()
        return LocalRedis(
            port=free_port(),
            directory=where,
            appendonly=appendonly,
            appendfsync=appendfsync,
            owns_directory=False,
            **options,  # type: ignore[arg-type]
        )

    primary = node("primary")
    group = LocalRedisSentinel(primary, [], [], service, root)
    try:
        primary.start()
        for index in range(replicas):
            replica = node(f"replica{index}", replica_of=primary.port)
            group.replicas.append(replica)
            replica.start()
        quorum = sentinels // 2 + 1
        config = (
            f"sentinel monitor {service} 127.0.0.1 {primary.port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        for index in range(sentinels):
            sentinel = node(f"sentinel{index}", sentinel_config=config)
            group.sentinels.append(sentinel)
            sentinel.start()
        group.wait_replicas_synced()
    except BaseException:
        group.stop()
        raise
    return group
