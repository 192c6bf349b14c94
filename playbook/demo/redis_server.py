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

__all__ = ["RedisServer"]


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
