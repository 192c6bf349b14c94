"""Worker processes, each mapping rows through the demo provider, all from one start line (B6).

A worker imports playbook, opens its store and warms up on it (one call through a tool with no
provider: the imports, the HTTP client, the store's first connection), says it is ready and
waits for the start line; then it maps its rows and prints when it ended and how its rows ended.
``start_line`` resets the demo once every worker is ready (so the warm-up calls are not counted),
starts them all at once and measures from then to the last worker's end.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .harness import Samples, admissions

READY_WITHIN = 120.0  # seconds for every worker to warm up

_WORKER = """
import json, os, sys, time
import pandas as pd
import playbook as pb

cfg = json.loads(sys.argv[1])
start, n = cfg["start"], cfg["n"]
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(start, start + n)],
                      "first": [f"P{i}" for i in range(start, start + n)]})
tool = pb.demo.email_tool(cfg["url"], provider=pb.Provider("demo", **cfg["provider"]))
store = pb.ReceiptStore(cfg["store"])
warm = pd.DataFrame({"domain": [f"warm{cfg['index']}.com"], "first": ["W"]})
warm.play.map(pb.demo.email_tool(cfg["url"], name="warm"), store=store, progress=False)
open(cfg["ready"], "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
    time.sleep(0.002)
try:
    out = frame.play.map(tool, store=store, progress=False, concurrency=cfg["concurrency"])
finally:
    store.close()
statuses = {str(status): int(n) for status, n in out["play_status"].value_counts().items()}
print(json.dumps({"ended": time.time(), "statuses": statuses}))
"""


@dataclass(frozen=True)
class Worker:
    provider: dict[str, Any]  # pb.Provider("demo", **provider)
    start: int  # its rows: company{start}.com ... company{start + n - 1}.com
    n: int
    store: str | None = None  # a directory or a redis:// URL; None: a new directory of its own
    concurrency: int = 16  # map(concurrency=)


@dataclass
class Finish:
    rows: int  # rows mapped, summed over the workers
    seconds: float  # from the start line to the last worker's end
    statuses: dict[str, int]  # rows by play_status, summed over the workers
    stats: dict[str, Any]  # the demo's counters after the run
    admitted: Samples = field(default_factory=list)  # the demo's admissions over the run, when watched

    @property
    def ok(self) -> int:
        return self.statuses.get("ok", 0)

    @property
    def done(self) -> int:
        """Rows ok, or reused from what another process finished."""
        return self.ok + self.statuses.get("reused", 0)

    @property
    def goodput(self) -> float:
        return self.ok / self.seconds

    @property
    def requests(self) -> int:
        return self.stats["requests"]

    @property
    def refused(self) -> int:
        return self.stats["by_status"].get("429", 0)

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0


def start_line(url: str, settings: dict[str, Any], workers: list[Worker], *, watch: bool = False) -> Finish:
    """Run ``workers`` against the demo reset to ``settings`` from one start line; with ``watch``,
    sample the demo's admissions while they run."""
    httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    with tempfile.TemporaryDirectory(prefix="pb-workers-") as tmp:
        work = Path(tmp)
        script = work / "worker.py"
        script.write_text(_WORKER)
        go = work / "go"
        procs = []
        for i, w in enumerate(workers):
            cfg = {
                "url": url,
                "provider": w.provider,
                "start": w.start,
                "n": w.n,
                "concurrency": w.concurrency,
                "store": w.store or str(work / f"store{i}"),
                "index": i,
                "ready": str(work / f"ready{i}"),
                "go": str(go),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), json.dumps(cfg)], stdout=subprocess.PIPE, text=True
                )
            )
        try:
            _wait_ready(work, procs)
            httpx.post(
                url + "/_reset", json=settings, timeout=5
            ).raise_for_status()  # the warm-up calls are not counted
            with admissions(url) if watch else contextlib.nullcontext([]) as admitted:
                began = time.time()
                go.touch()
                outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    stats = httpx.get(url + "/_stats", timeout=5).json()
    rows = sum(w.n for w in workers)
    return Finish(rows, max(o["ended"] for o in outs) - began, summed_statuses(outs), stats, admitted)


def summed_statuses(outs: list[dict[str, Any]]) -> dict[str, int]:
    """The rows of every worker process by status, from what each printed (``statuses``)."""
    statuses: dict[str, int] = {}
    for out in outs:
        for status, n in out["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    return statuses


def _wait_ready(work: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + READY_WITHIN
    while not all((work / f"ready{i}").exists() for i in range(len(procs))):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker process did not get ready")
        time.sleep(0.01)
