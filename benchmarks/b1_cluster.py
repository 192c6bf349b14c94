"""B1 on a Redis Cluster: a first run and a receipts replay of 100,000 rows with the store on a
3-master Redis Cluster (a replica each, every node keeping an append-only file), beside the same
on one Redis server, measured in the same run, interleaved.

- first run: 100,000 rows of one trivial async call each, none answered yet: every call is made
  and its receipt, the row's memo and its hint written;
- receipts replay: an edited play (a new version) over the same calls: every row memo misses and
  every call is answered by the receipt the first run wrote; the new memos are written.

Baseline: the same on the single server, in the same repeat (the order alternates, and both are
emptied before each repeat).  Target: the cluster >= 0.8 of the single server for each.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import pandas as pd

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer

from .harness import Result, emptied

ROWS = 100_000
CONCURRENCY = 16
TARGET = 0.8


def run(repeats: int = 3) -> list[Result]:
    with RedisServer() as single, RedisClusterServer() as cluster:
        rates = measure({"single": single, "cluster": cluster}, repeats, ROWS)
    return [
        Result(
            f"B1c {case} (cluster, {ROWS // 1000}k)",
            "/s",
            statistics.median(rates[case]["cluster"]),
            statistics.median(rates[case]["single"]),
            "the same on one Redis server",
            TARGET,
            notes=[
                (
                    "each repeat, cluster / one server: "
                    + ", ".join(
                        f"{c:,.0f} / {s:,.0f}" for c, s in zip(rates[case]["cluster"], rates[case]["single"])
                    ),
                    None,
                )
            ],
        )
        for case in ("first run", "receipts replay")
    ]


def measure(
    servers: dict[str, RedisServer | RedisClusterServer], repeats: int, rows: int
) -> dict[str, dict[str, list[float]]]:
    """Rows a second of each case on each server: ``{case: {server: [rate per repeat]}}``."""
    frame = pd.DataFrame({"n": range(rows)})
    rates: dict[str, dict[str, list[float]]] = {
        case: {name: [] for name in servers} for case in ("first run", "receipts replay")
    }
    tools = itertools.count()
    names = list(servers)
    for repeat in range(repeats):
        tool = _tool(f"lookup-{next(tools)}")
        for name in names if repeat % 2 == 0 else names[::-1]:
            emptied(servers[name])  # type: ignore[arg-type]  # a cluster is emptied as a server is
            store = pb.ReceiptStore(servers[name].url)
            try:
                first = _timed(frame, store, tool, "1", lambda s: s.ok == rows and s.calls_reused == 0)
                replay = _timed(
                    frame, store, tool, "2", lambda s: s.calls_reused == rows and s.calls_executed == 0
                )
            finally:
                store.close()
            rates["first run"][name].append(first)
            rates["receipts replay"][name].append(replay)
    return rates


def _tool(name: str) -> Callable[..., object]:
    @pb.tool(name=name, version="1")
    async def lookup(n: int) -> dict:
        return {"n": n, "label": f"item-{n}"}

    return lookup


def _timed(
    frame: pd.DataFrame,
    store: pb.ReceiptStore,
    tool: Callable[..., object],
    version: str,
    check: Callable[[pb.RunStats], bool],
) -> float:
    async def body(row, ctx):
        return {"v": await ctx.tool(tool, n=row.n)}

    start = time.perf_counter()
    run = frame.play.run(
        pb.play(body, name="b1c", version=version), store=store, progress=False, concurrency=CONCURRENCY
    )
    elapsed = time.perf_counter() - start
    assert check(run.stats), run.stats
    return len(run.result) / elapsed
