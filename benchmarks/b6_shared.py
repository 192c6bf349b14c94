"""B6: one provider account, many processes.  The demo provider (its own process) enforces the
account's limits: a 20/s token bucket (burst 10) and 8 requests in flight, 0.2 s per answer.
Two, then four worker processes each map their share of 300 rows (distinct inputs) through
``pb.Provider("demo", rps=20, concurrency=8, shared=<redis>)`` against a throwaway redis-server
(``playbook.demo.redis_server``).

     contender                     targets
     shared=redis://... (ours)     goodput >= 0.95 x 20/s combined; 429s <= 2% of requests;
                                   at most 8 in flight at the demo; 0 duplicate dispatches
     shared=None (the baseline)    the same processes, each pacing alone: printed for reference

Goodput is rows ok per second from the start line (every worker warmed up and waiting) to the
last worker's end.  A duplicate dispatch is a call the demo admitted (answered other than 429)
more than once: admitted requests less rows.  The ratio is ours over the baseline's goodput.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from playbook.demo.redis_server import RedisServer

from .harness import Result, demo_process

ROWS = 300
RPS = 20.0
IN_FLIGHT = 8
DEMO = {"rps": RPS, "burst": 10, "max_in_flight": IN_FLIGHT, "latency": 0.2}
GOODPUT = 0.95  # of RPS
REFUSED = 0.02  # of requests
BASELINE = "shared=None (each process paces alone)"

_WORKER = """
import json, os, sys, time
import pandas as pd
import playbook as pb

cfg = json.loads(sys.argv[1])
start, n = cfg["start"], cfg["n"]
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(start, start + n)],
                      "first": [f"P{i}" for i in range(start, start + n)]})
provider = pb.Provider("demo", rps=20, concurrency=8, shared=cfg["shared"])
tool = pb.demo.email_tool(cfg["url"], provider=provider)
home = cfg["home"]
# Warm up (imports, the HTTP client) on a provider of its own, so the start line is not a stall.
warm = pd.DataFrame({"domain": [f"warm{start}.com"], "first": ["W"]})
warm.play.map(pb.demo.email_tool(cfg["url"], name="warm"), store=pb.ReceiptStore(home + "-warm"), progress=False)
store = pb.ReceiptStore(home)
open(cfg["ready"], "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
    time.sleep(0.002)
try:
    out = frame.play.map(tool, store=store, progress=False, concurrency=16)
finally:
    store.close()
print(json.dumps({"ended": time.time(), "ok": int((out["play_status"] == "ok").sum())}))
"""


def run(repeats: int = 1) -> list[Result]:
    results = []
    with demo_process() as url, RedisServer() as redis:
        redis_url = redis.url
        for count in (2, 4):
            ours, base = [], []
            for _ in range(repeats):
                base.append(_measured(url, count, None))
                ours.append(_measured(url, count, redis_url))
            results.append(_row(count, _median(ours), _median(base)))
    return results


def _row(count: int, mine: dict[str, Any], base: dict[str, Any]) -> Result:
    result = Result(f"B6 {count} processes, shared", "/s", mine["goodput"], base["goodput"], BASELINE, 1.0)
    floor = GOODPUT * RPS
    result.notes = [
        (f"goodput {mine['goodput']:.1f}/s >= {floor:.1f}/s ({GOODPUT:.2f} x {RPS:g}/s); {mine['rows'] - mine['ok']} rows not ok",
         mine["goodput"] >= floor and mine["ok"] == mine["rows"]),
        (f"429s {mine['refused_share']:.1%} of {mine['requests']} requests <= {REFUSED:.0%}", mine["refused_share"] <= REFUSED),
        (f"max in flight at the demo {mine['max_in_flight']} <= {IN_FLIGHT}", mine["max_in_flight"] <= IN_FLIGHT),
        (f"duplicate dispatches {mine['duplicates']}", mine["duplicates"] == 0),
        (f"baseline: {base['goodput']:.1f}/s, 429s {base['refused_share']:.0%} of {base['requests']}, "
         f"max in flight {base['max_in_flight']}, {base['rows'] - base['ok']} rows not ok", None),
    ]  # fmt: skip
    return result


def _measured(url: str, count: int, shared: str | None) -> dict[str, Any]:
    """Reset the demo, run ``count`` workers over ``ROWS`` rows from one start line, read the counters."""
    httpx.post(url + "/_reset", json=DEMO, timeout=5).raise_for_status()
    rows = ROWS // count
    with tempfile.TemporaryDirectory(prefix="pb-b6-") as tmp:
        work = Path(tmp)
        script = work / "worker.py"
        script.write_text(_WORKER)
        go = work / "go"
        procs = []
        for i in range(count):
            cfg = {"url": url, "shared": shared, "start": i * rows, "n": rows, "home": str(work / f"store{i}"),
                   "ready": str(work / f"ready{i}"), "go": str(go)}  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], stdout=subprocess.PIPE, text=True))
        try:
            deadline = time.monotonic() + 120
            while not all((work / f"ready{i}").exists() for i in range(count)):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("B6: a worker did not get ready")
                time.sleep(0.01)
            httpx.post(url + "/_reset", json=DEMO, timeout=5).raise_for_status()  # the warm-up calls are not counted
            began = time.time()
            go.touch()
            outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    stats = httpx.get(url + "/_stats", timeout=5).json()
    seconds = max(o["ended"] for o in outs) - began
    ok = sum(o["ok"] for o in outs)
    refused = stats["by_status"].get("429", 0)
    return {
        "rows": rows * count, "ok": ok, "goodput": ok / seconds, "requests": stats["requests"],
        "refused_share": refused / stats["requests"] if stats["requests"] else 0.0,
        "max_in_flight": stats["max_in_flight"], "duplicates": stats["requests"] - refused - rows * count,
    }  # fmt: skip


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["goodput"])[(len(runs) - 1) // 2]
