"""A throwaway ``redis-server`` on a free loopback port, for trying the shared store and limiter
on one machine (the tests and benchmarks start theirs this way).  It needs the server binary:
Debian's ``redis-server`` package (``make test`` installs it), or ``$PLAYBOOK_REDIS_SERVER``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["RedisClusterServer", "RedisServer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """Start with ``with RedisServer() as server:``; ``server.url`` is ``redis://127.0.0.1:PORT/0``.

    It keeps an append-only file (what playbook asks of a store's server); ``options`` go on its
    command line after that, to start it otherwise (``RedisServer("--appendonly", "no")``: stock
    persistence, RDB snapshots only).
    """

    def __init__(self, *options: str) -> None:
        self.options = options
        binary = (
            os.environ.get("PLAYBOOK_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
        )
        if not Path(binary).exists():
            raise RuntimeError(
                "redis-server is not installed: apt-get install redis-server (make test does), or set $PLAYBOOK_REDIS_SERVER"
            )
        self.binary = binary
        self.port = 0
        self.dir = tempfile.mkdtemp(prefix="playbook-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again after :meth:`crash`: on the same port, from the same files)."""
        self.port = self.port or _free_port()
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--dir",
            self.dir,
            *self.options,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)

    def crash(self) -> None:
        """Kill it with SIGKILL, as a crash does: what it had not written to its files is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_port() -> int:
    """A free port whose cluster bus port (``+10000``) is one too."""
    while True:
        port = _free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _state_ok(info: object) -> bool:
    text = info if isinstance(info, str) else str(info)
    return "cluster_state:ok" in text or (isinstance(info, dict) and info.get("cluster_state") == "ok")


class RedisClusterServer:
    """A throwaway Redis Cluster on loopback: ``masters`` masters, each with ``replicas`` replicas
    (3 and 1: six ``redis-server`` processes), each keeping an append-only file.  Start with
    ``with RedisClusterServer() as cluster:``; ``cluster.url`` is a plain ``redis://`` URL of one
    master, as a user gives playbook (it finds the rest).  ``node_timeout`` (milliseconds) is how
    long a master may be silent before its replica takes over (:meth:`kill`)."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout: int = 2000) -> None:
        self.nodes = [
            RedisServer(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout),
                # a replica takes over however long its master was quiet (an idle master's replica
                # looks stale to the default factor, and would not)
                "--cluster-replica-validity-factor",
                "0",
                "--repl-diskless-sync-delay",  # a replica attaches at once, not after 5 s
                "0",
            )
            for _ in range(masters * (1 + replicas))
        ]
        self.masters_wanted = masters
        self.replicas = replicas
        self.killed: list[RedisServer] = []

    @property
    def url(self) -> str:
        alive = [node for node in self.nodes if node.process is not None]
        return f"redis://127.0.0.1:{alive[0].port}/0"

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.port = node.port or _cluster_port()
                node.start()
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def _ask(self, node: RedisServer, *command: str) -> object:
        import redis  # the cluster is for trying the shared store, which needs redis-py anyway

        with redis.Redis(port=node.port, socket_timeout=2, decode_responses=True) as client:
            return client.execute_command(*command)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and agrees on its masters."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                alive = [node for node in self.nodes if node.process is not None]
                if (
                    all(_state_ok(self._ask(node, "CLUSTER", "INFO")) for node in alive)
                    and len(self.masters()) >= self.masters_wanted
                    and (self.killed or self.replicated())
                ):
                    return
            except Exception:  # a node still starting, or one that just went
                pass
            time.sleep(0.1)
        raise RuntimeError("the Redis cluster did not come up")

    def masters(self) -> list[RedisServer]:
        """The live nodes that are masters now (with slots)."""
        found = []
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                role = self._ask(node, "ROLE")
            except Exception:
                continue
            if isinstance(role, list) and role and role[0] == "master" and self._owns_slots(node):
                found.append(node)
        return found

    def _owns_slots(self, node: RedisServer) -> bool:
        nodes = self._ask(node, "CLUSTER", "NODES")
        text = nodes if isinstance(nodes, str) else "\n".join(f"{k} {v}" for k, v in dict(nodes).items())  # type: ignore[call-overload]
        mine = next((line for line in text.splitlines() if "myself" in line), "")
        return len(mine.split()) > 8  # slot ranges follow the eight fixed fields

    def replicated(self) -> bool:
        """Every master has its replicas attached."""
        for node in self.masters():
            role = self._ask(node, "ROLE")
            if not isinstance(role, list) or len(role[2]) < self.replicas:
                return False
        return True

    def kill(self, node: RedisServer | None = None) -> RedisServer:
        """SIGKILL a master (the first unless told): its replica takes over after the node timeout."""
        node = node or self.masters()[0]
        node.crash()
        self.killed.append(node)
        return node

    def revive(self) -> None:
        """Start the killed nodes again, from their files: each comes back as a replica."""
        for node in self.killed:
            node.start()
        self.killed = []
        self.wait_ok()

    def flush(self) -> None:
        for node in self.masters():
            node.flush()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
