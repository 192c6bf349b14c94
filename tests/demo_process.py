"""The demo provider in a process of its own, for the promise suite (``test_promises_*``).

A provider is not in its client's process.  In one, it shares the interpreter's lock (and, on a
loaded machine, its share of the CPU) with the Dask client, the run's own loop and the test:
when they hold it, requests that arrived on time wait in its socket and are judged together,
and a strict provider (a burst of 1) refuses all but the first of them, refusals the client
did nothing to earn.  Measured against such a provider, a promise about rates holds or not by
how busy the test's process was.  Here the provider runs as ``python -m playbook.demo``, and
this handle steers it over its admin endpoints, with the face of :class:`DemoServer` that the
suite uses: ``url``, ``stats()``, ``reset(**settings)``, ``configure(**settings)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx

__all__ = ["DemoProcess"]


class DemoProcess:
    """A demo provider started in its own process; ``stop()`` ends it."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "playbook.demo", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"the demo provider did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[-1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        self._admin = httpx.Client(base_url=self.url, timeout=10)

    def __repr__(self) -> str:
        return f"<DemoProcess {self.url} pid={self._process.pid}>"

    def stats(self) -> dict[str, Any]:
        return self._ask("GET", "/_stats")

    def reset(self, **settings: Any) -> dict[str, Any]:
        return self._ask("POST", "/_reset", settings)

    def configure(self, **settings: Any) -> dict[str, Any]:
        return self._ask("POST", "/_configure", settings)

    def _ask(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = self._admin.request(method, path, json=body)
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    def stop(self) -> None:
        if hasattr(self, "_admin"):
            self._admin.close()
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
