"""B15: a Redis Cluster loses a master mid-run.  3 worker processes each map THE SAME 1,200 rows
through the demo provider (its own process; 0.1 s per answer) at ``concurrency=8`` each, the store
and the provider's shared limits (``rps=400``, 16 calls in flight across the processes) on a
throwaway Redis Cluster of 3 masters, each with a replica (``cluster-node-timeout`` 2 s).  Once
as it is (the baseline), once with a master SIGKILLed when a third of the rows were asked for
(its replica takes over); then a rerun on what the cluster kept.

     contender                    targets
     a master killed (ours)       >= 0.5 of the baseline's rows per second; calls paid twice <= the
                                  calls the processes had in flight (3 x 8); every row ok, reused, or
                                  failed naming the failover; the rerun pays only for the rows that
                                  failed so
     no master killed (the baseline, same rows, same cluster, emptied between)

Paid twice is the demo's own count: the requests it answered over the run and its rerun, beyond
the 1,200 different calls.  Time lost is the run's time beyond the baseline's.  A row waited when
its call took over 2 s (the cluster's node timeout, the least a failover takes) from the play's
ask to its answer (0.1 s of latency: the rest is the store's lease and the shared limits, which
wait for the cluster), counted once per row.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer

from .harness import Result, demo_process
from .workers import summed_statuses

ROWS = 1_200
PROCESSES = 3
CONCURRENCY = 8  # per process
PROVIDER = {"rps": 400, "concurrency": 16}  # shared by the processes, on the cluster
DEMO = {"latency": 0.1}
KILL_AT = ROWS // 3  # requests the demo saw when a master is killed
WAITED = 2.0  # seconds from the ask to the answer past which a row waited: the node timeout, the least a failover takes
TARGET = 0.5  # the killed run's rows per second over the baseline's

_WORKER = """
import json, os, sys, time
import pandas as pd
import playbook as pb

cfg = json.loads(sys.argv[1])
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(cfg["rows"])],
                      "first": [f"P{i}" for i in range(cfg["rows"])]})
tool = pb.demo.email_tool(cfg["url"], provider=pb.Provider("demo", shared=cfg["store"], **cfg["provider"]))

async def timed(row, ctx):
    began = time.time()
    email = await ctx.tool(tool, domain=row.domain, first=row.first)
    return {"email": email, "took": time.time() - began}

store = pb.ReceiptStore(cfg["store"])
warm = pd.DataFrame({"domain": [f"warm{cfg['index']}.com"], "first": ["W"]})
warm.play.map(pb.demo.email_tool(cfg["url"], name="warm"), store=store, progress=False)
open(cfg["ready"], "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
    time.sleep(0.002)
try:
    out = frame.play.run(pb.play(timed, name="timed"), store=store, progress=False,
                         concurrency=cfg["concurrency"]).result
finally:
    store.close()
ok = out["play_status"] == "ok"
print(json.dumps({
    "ended": time.time(),
    "statuses": {str(s): int(n) for s, n in out["play_status"].value_counts().items()},
    "errors": sorted(set(out.loc[out["play_status"] == "failed", "play_error"].astype(str))),
    "waited": [int(i) for i in out.index[ok & (out["took"] > cfg["waited"])]],
}))
"""


@dataclass
class Ended:
    seconds: float  # from the start line to the last process's end
    statuses: dict[str, int]  # rows by play_status, summed over the processes
    errors: list[str]  # the failed rows' errors, each once
    waited: int  # rows whose call took over WAITED seconds, each row once
    answered: int  # requests the demo answered
    killed_in_flight: int | None = None  # the demo's calls in flight when the master was killed

    @property
    def failed(self) -> int:
        return self.statuses.get("failed", 0)


def run(repeats: int = 1) -> list[Result]:
    results = []
    with demo_process() as url:
        for _ in range(repeats):
            with RedisClusterServer() as cluster:
                calm = _ran(url, cluster, kill=False)
                _emptied(cluster)
                killed = _ran(url, cluster, kill=True)
                again = _ran(url, cluster, kill=False, processes=1)
            results.append(_row(calm, killed, again))
    return results


def _emptied(cluster: RedisClusterServer) -> None:
    """The cluster flushed between runs, and the store's loss accepted (emptied on purpose)."""
    cluster.flush()
    store = pb.ReceiptStore(cluster.url)
    store.accept_loss()
    store.close()


def _ran(url: str, cluster: RedisClusterServer, *, kill: bool, processes: int = PROCESSES) -> Ended:
    """``processes`` processes over the same rows from one start line; with ``kill``, a master is
    SIGKILLed once the demo saw ``KILL_AT`` requests."""
    with tempfile.TemporaryDirectory(prefix="pb-b15-") as tmp:
        work = Path(tmp)
        script, go = work / "worker.py", work / "go"
        script.write_text(_WORKER)
        procs = [_start(script, url, cluster.url, work, i) for i in range(processes)]
        try:
            _ready(work, procs)
            httpx.post(url + "/_reset", json=DEMO, timeout=5).raise_for_status()
            killer = _Killer(url, cluster) if kill else None
            began = time.time()
            go.touch()
            outs = [_said(p) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    stats = httpx.get(url + "/_stats", timeout=5).json()
    statuses = summed_statuses(outs)
    return Ended(
        max(o["ended"] for o in outs) - began,
        statuses,
        sorted({e for o in outs for e in o["errors"]}),
        len({i for o in outs for i in o["waited"]}),
        stats["requests"] - stats["by_status"].get("429", 0),
        killer.join() if killer else None,
    )


class _Killer:
    """A thread that SIGKILLs a master of ``cluster`` once the demo saw ``KILL_AT`` requests, and
    notes the demo's calls in flight then."""

    def __init__(self, url: str, cluster: RedisClusterServer) -> None:
        self.in_flight: int | None = None
        self._thread = threading.Thread(target=self._watch, args=(url, cluster), daemon=True)
        self._thread.start()

    def _watch(self, url: str, cluster: RedisClusterServer) -> None:
        with httpx.Client(timeout=5) as client:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                stats = client.get(url + "/_stats").json()
                if stats["requests"] >= KILL_AT:
                    self.in_flight = int(stats["in_flight"])
                    cluster.kill()
                    return
                time.sleep(0.005)

    def join(self) -> int | None:
        self._thread.join(60)
        return self.in_flight


def _start(script: Path, url: str, store: str, work: Path, i: int) -> subprocess.Popen[str]:
    cfg = {
        "url": url,
        "store": store,
        "provider": PROVIDER,
        "rows": ROWS,
        "concurrency": CONCURRENCY,
        "waited": WAITED,
        "index": i,
        "ready": str(work / f"ready{i}"),
        "go": str(work / "go"),
    }
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ready(work: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 120
    while not all((work / f"ready{i}").exists() for i in range(len(procs))):
        ended = [p for p in procs if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            err = ended[0].communicate()[1][-2000:] if ended else "(still warming up)"
            raise RuntimeError(f"a worker process did not get ready: {err}")
        time.sleep(0.01)


def _said(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    lines = out.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"a worker process failed ({proc.returncode}): {err[-2000:]}")
    said: dict[str, Any] = json.loads(lines[-1])
    return said


def _row(calm: Ended, killed: Ended, again: Ended) -> Result:
    result = Result(
        f"B15 failover, {PROCESSES} procs same rows",
        "/s",
        ROWS / killed.seconds,
        ROWS / calm.seconds,
        "no master killed, the same cluster",
        TARGET,
    )
    in_flight = PROCESSES * CONCURRENCY
    paid_twice = killed.answered + again.answered - ROWS
    ended = killed.statuses.get("ok", 0) + killed.statuses.get("reused", 0) + killed.failed
    named = all("lost a master" in error for error in killed.errors)
    result.notes = [
        (
            f"paid twice {paid_twice} <= calls in flight {PROCESSES} x {CONCURRENCY} = {in_flight} "
            f"(the demo had {killed.killed_in_flight} in flight at the kill)",
            0 <= paid_twice <= in_flight,
        ),
        (
            f"time lost {killed.seconds - calm.seconds:.1f}s: {killed.seconds:.1f}s vs {calm.seconds:.1f}s "
            "without the kill",
            None,
        ),
        (f"rows that waited > {WAITED:g}s: {killed.waited} (without the kill: {calm.waited})", None),
        (
            f"rows ended: {_statuses(killed)}; failed ones name the failover: {named}",
            ended == PROCESSES * ROWS and named,
        ),
        (
            f"rerun: {_statuses(again)}, paid {again.answered} <= the {killed.failed} rows failed",
            again.answered <= killed.failed and again.statuses.get("failed", 0) == 0,
        ),
    ]
    if killed.errors:
        result.notes.append((f"an error: {killed.errors[0][:150]}", None))
    return result


def _statuses(ended: Ended) -> str:
    return ", ".join(f"{n:,} {status}" for status, n in sorted(ended.statuses.items()))
