"""B9: a play over a Dask DataFrame on a ``distributed.LocalCluster`` of two worker processes (one
thread each), its receipts, memos and provider limits in a throwaway redis-server
(``playbook.demo.redis_server``).  The cluster is started and warmed up (every worker has run a
small play once) before anything is timed; its start-up is no part of any figure.

  B9   100,000 rows in 10 partitions through a cheap async tool that costs 0.0001 (each call is
       paid and leaves a receipt), one call per row.  Ours: ``ddf.play.map(...)`` on the cluster,
       timed from the call to its return (partition lengths measured, tasks submitted, their
       reports drained, the result's metadata built); ``.compute()`` afterwards is not timed but
       printed.  Baseline: ``pandas_df.play.map(...)`` over the same rows in this process.  Both
       on the same Redis, flushed before each, so both pay for every call.  Target: rows/s on the
       cluster >= 0.8 x one process's.  The note's per-row overhead is the worker time the
       cluster spends beyond one process: (2 workers x cluster seconds - one process's seconds)
       / rows, in microseconds; 0 would be two workers each doing half the work exactly as fast
       as one process does all of it (this machine's client, scheduler and Redis share its cores,
       so they are in that figure too).  As wall time on a busy machine says more about the
       machine than about the code, the CPU seconds of each process during ``map()`` are printed
       per row as well: the workers' sum against the one process, then the client, the
       scheduler and redis-server.

  B9b  1,200 rows in 8 partitions through the demo's email finder (an ``http_tool``) under
       ``pb.Provider("demo", rps=50)``, no ``shared=``: the cluster run shares its limits
       through the store's Redis.  The demo (its own process) allows 50 requests/s per key
       (0.05 s per answer; burst 25, half a second's worth as in B6: with 10, a stall of 0.2 s on a
       busy machine, of the demo or of a worker, makes a bunch of 429s, and the rate cut that
       follows lasts past the run).  Goodput is answers admitted (not 429) per second in the
       steady state: a thread polls the demo's ``/_stats`` every 0.1 s, and goodput is the
       least-squares slope of admitted answers over time while they are between 10% and 90% of
       the rows, so neither the start (the burst, the first tasks starting) nor the end (the
       last partition alone) weighs in.  Targets: >= 0.95 x 50/s; 429s <= 2% of requests over
       the whole run; every row ok.

  B9b  also two stricter limits, each on the same cluster and Redis, judged on the provider's
       clock (the demo counts the requests it admitted past every limit and the seconds between
       the first and the last of them; the ratio is the ideal seconds for that many over those):
         a token bucket of 20/s, burst 2 (0.15 s per answer), 400 rows in 8 partitions under
         ``pb.Provider("demo", rps=20)``: ideal (admitted - 2) / 20/s; >= 0.95, 429s <= 2%;
         a fixed window of 50 calls per aligned 5 s (0.05 s per answer), 300 rows in 8
         partitions under ``pb.Provider("demo", window=(50, 5))``: ideal (admitted - 50) /
         (50 / 5 s); >= 0.95, no 429.
       Every row ok in both.

  B9b  on a Redis Cluster of 3 masters (each with a replica, ``RedisClusterServer``) beside the one
       server, in the same run: the token bucket of 20/s, burst 2 above, its limits shared on the
       cluster (``pb.Provider("demo", rps=20, shared=<cluster>)``), the job's store on the cluster
       when ``STORE_ON_CLUSTER`` (else on the one server, as above); >= 0.95 on the provider's
       clock, 429s <= 2%, every row ok; the one server's figures beside.  ``B9_ONLY=cluster``
       runs the bucket on the one server and on the cluster alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer

from .harness import (
    Result,
    admissions,
    clock_row,
    demo_process,
    emptied,
    on_providers_clock,
    refused_note,
    slope,
)

ROWS = 100_000
PARTITIONS = 10
WORKERS = 2
CHEAP_TARGET = 0.8

SHARED_ROWS = 1_200
SHARED_PARTITIONS = 8
RPS = 50.0
DEMO = {"rps": RPS, "burst": 25, "latency": 0.05}
GOODPUT = 0.95  # of RPS
REFUSED = 0.02  # of requests
STEADY = (0.10, 0.90)  # the share of rows admitted between which goodput is measured
STRICT = {"rps": 20, "burst": 2, "latency": 0.15}
STRICT_ROWS = 400
WINDOW = {"window_limit": 50, "window_seconds": 5.0, "latency": 0.05}
WINDOW_ROWS = 300
ON_CLOCK = 0.95  # of ideal, on the provider's clock
STORE_ON_CLUSTER = True  # the job's store on the cluster too (False: on the one server)


def run(repeats: int = 1) -> list[Result]:
    import dask.dataframe as dd

    with RedisServer() as redis, demo_process() as url, _cluster() as client:
        _warm(client, redis)
        if os.environ.get("B9_ONLY") == "cluster":
            return _on_redis_cluster(redis, url, repeats)
        frame = pd.DataFrame({"word": [f"w{i}" for i in range(ROWS)]})
        parts = dd.from_pandas(frame, npartitions=PARTITIONS)
        play = _cheap_play()
        ours: list[dict[str, float]] = []
        single: list[dict[str, float]] = []
        for _ in range(repeats):  # interleaved, so a slow spell of the machine hits both
            emptied(redis)
            single.append(_one_process(frame, play, redis))
            emptied(redis)
            ours.append(_on_cluster(client, parts, play, redis))
        cheap = _cheap_row(_median(single, "seconds"), _median(ours, "seconds"))
        shared, strict, window = [], [], []
        for _ in range(repeats):
            shared.append(_shared(redis, url, DEMO, {"rps": RPS}, SHARED_ROWS))
            strict.append(_shared(redis, url, STRICT, {"rps": 20}, STRICT_ROWS))
            window.append(_shared(redis, url, WINDOW, {"window": (50, 5)}, WINDOW_ROWS))
        return [
            cheap,
            _shared_row(_median(shared, "goodput")),
            _clock_row(
                f"B9b {WORKERS} workers, burst 2: rps=20",
                STRICT,
                _median(strict, "on_clock"),
                ON_CLOCK,
                REFUSED,
            ),
            _clock_row(
                f"B9b {WORKERS} workers: window=(50, 5)", WINDOW, _median(window, "on_clock"), ON_CLOCK, 0.0
            ),
            *_on_redis_cluster(redis, url, repeats),
        ]


def _on_redis_cluster(redis: RedisServer, url: str, repeats: int) -> list[Result]:
    """The bucket of 20/s, burst 2 with its limits on the one server, then on a 3-master cluster."""
    one: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    with RedisClusterServer() as cluster:
        for _ in range(repeats):
            one.append(_shared(redis, url, STRICT, {"rps": 20}, STRICT_ROWS))
            cluster.flush()
            store = cluster if STORE_ON_CLUSTER else redis
            ours.append(_shared(store, url, STRICT, {"rps": 20, "shared": cluster.url}, STRICT_ROWS))
    single = _median(one, "on_clock")
    row = _clock_row(
        f"B9b {WORKERS} workers, burst 2: rps=20, 3-master cluster",
        STRICT,
        _median(ours, "on_clock"),
        ON_CLOCK,
        REFUSED,
    )
    refused = single["stats"]["by_status"].get("429", 0)
    row.notes.append(
        (
            f"one Redis server in this run: {single['on_clock'] * STRICT['rps']:.1f}/s on the provider's clock, "
            f"429s {refused} of {single['stats']['requests']}, {single['rows'] - single['ok']} rows not ok",
            None,
        )
    )
    return [row]


@contextlib.contextmanager
def _cluster() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(WORKERS)
        yield client


def _cheap_play() -> pb.Play:
    # Made here, not at module level: cloudpickle then sends the code itself, so the workers
    # need not import this package.
    @pb.tool(cost=0.0001, version="1")
    async def shout(word: str) -> str:
        return word.upper()

    @pb.play
    async def loud(row: Any, ctx: Any) -> dict[str, Any]:
        return {"loud": await ctx.tool(shout, word=row.word)}

    return loud


def _warm(client: Any, redis: RedisServer) -> None:
    """Every worker imports playbook and opens its store; this process too."""
    import dask.dataframe as dd

    frame = pd.DataFrame({"word": [f"warm{i}" for i in range(200)]})
    play = _cheap_play()
    frame.play.map(play, store=redis.url, progress=False)
    dd.from_pandas(frame, npartitions=4).play.map(play, store=redis.url, progress=False).compute()
    assert len(client.scheduler_info()["workers"]) == WORKERS


def _one_process(frame: pd.DataFrame, play: pb.Play, redis: RedisServer) -> dict[str, float]:
    """Wall seconds of ``map()`` in this process; CPU seconds of this process and of Redis."""
    cpu, server, start = time.process_time(), _cpu_of(redis), time.perf_counter()
    out = frame.play.map(play, store=redis.url, progress=False)
    seconds = time.perf_counter() - start
    used = {"seconds": seconds, "cpu": time.process_time() - cpu, "redis": _cpu_of(redis) - server}
    statuses = out["play_status"].value_counts().to_dict()
    assert statuses == {"ok": len(frame)}, statuses  # a flushed store: every row's call paid
    return used


def _on_cluster(client: Any, parts: Any, play: pb.Play, redis: RedisServer) -> dict[str, float]:
    """Wall seconds of ``map()`` on the cluster and of ``.compute()`` after it; CPU seconds of
    the workers, the scheduler, this process and Redis during ``map()``."""
    workers, scheduler = client.run(time.process_time), client.run_on_scheduler(time.process_time)
    cpu, server, start = time.process_time(), _cpu_of(redis), time.perf_counter()
    result = parts.play.map(play, store=redis.url, progress=False)
    seconds = time.perf_counter() - start
    used = {
        "seconds": seconds,
        "client": time.process_time() - cpu,
        "redis": _cpu_of(redis) - server,
        "workers": sum(client.run(time.process_time).values()) - sum(workers.values()),
        "scheduler": client.run_on_scheduler(time.process_time) - scheduler,
    }
    start = time.perf_counter()
    out = result.compute()
    used["fetched"] = time.perf_counter() - start
    statuses = out["play_status"].value_counts().to_dict()
    assert statuses == {"ok": ROWS}, statuses
    assert out["loud"].iloc[-1] == f"W{ROWS - 1}"
    return used


def _cpu_of(redis: RedisServer) -> float:
    """CPU seconds the redis-server process has used (Linux's /proc; 0 elsewhere)."""
    assert redis.process is not None
    try:
        fields = Path(f"/proc/{redis.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cheap_row(single: dict[str, float], cluster: dict[str, float]) -> Result:
    seconds, alone = cluster["seconds"], single["seconds"]
    result = Result(
        f"B9 cluster, {ROWS // 1000}k rows ({WORKERS} workers)",
        "/s",
        ROWS / seconds,
        ROWS / alone,
        "pandas df.play.map, one process",
        CHEAP_TARGET,
    )
    overhead = (WORKERS * seconds - alone) / ROWS * 1e6
    per_row = 1e6 / ROWS
    result.notes = [
        (
            f"map {seconds:.1f}s on the cluster ({PARTITIONS} partitions), {alone:.1f}s in one process; "
            f".compute() after it {cluster['fetched']:.2f}s (not timed)",
            None,
        ),
        (
            f"cluster overhead {overhead:.0f} us/row of worker wall time: ({WORKERS} x {seconds:.1f}s - {alone:.1f}s) / "
            f"{ROWS:,} (one process: {alone * per_row:.0f} us/row)",
            None,
        ),
        (
            f"CPU per row: workers {cluster['workers'] * per_row:.0f} us vs one process {single['cpu'] * per_row:.0f} us; "
            f"on top, client {cluster['client'] * per_row:.0f} us, scheduler {cluster['scheduler'] * per_row:.0f} us; "
            f"Redis {cluster['redis'] * per_row:.0f} us vs {single['redis'] * per_row:.0f} us",
            None,
        ),
    ]
    return result


def _shared(
    redis: RedisServer | RedisClusterServer,
    url: str,
    settings: dict[str, Any],
    provider: dict[str, Any],
    rows: int,
) -> dict[str, Any]:
    """One cluster run of the email finder under ``pb.Provider("demo", **provider)`` against the
    demo reset to ``settings``; the demo's admissions sampled while it runs."""
    import dask.dataframe as dd

    if isinstance(redis, RedisServer):
        emptied(redis)
    else:  # the store on the cluster, emptied on purpose: not one that lost its receipts
        redis.flush()
        store = pb.ReceiptStore(redis.url)
        store.accept_loss()
        store.close()
    frame = pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(rows)], "first": [f"P{i}" for i in range(rows)]}
    )
    parts = dd.from_pandas(frame, npartitions=SHARED_PARTITIONS)
    tool = pb.demo.email_tool(url, provider=pb.Provider("demo", **provider))
    httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    with admissions(url) as samples:
        start = time.perf_counter()
        result = parts.play.map(tool, store=redis.url, progress=False)
        seconds = time.perf_counter() - start
    out = result.compute()
    stats = httpx.get(url + "/_stats", timeout=5).json()
    low, high = (share * rows for share in STEADY)
    window = [(t, n) for t, n in samples if low <= n <= high]
    began = next(t for t, n in samples if n > 0)
    ended = next(t for t, n in samples if n >= stats["admitted"])
    return {
        "rows": rows,
        "ok": int((out["play_status"] == "ok").sum()),
        "goodput": slope(window),
        "window": window[-1][0] - window[0][0],
        "whole": stats["admitted"] / (ended - began),
        "sending": ended - began,
        "map": seconds,
        "stats": stats,
        "on_clock": on_providers_clock(settings, stats),
    }


def _shared_row(m: dict[str, Any]) -> Result:
    result = Result(
        f"B9b shared {RPS:g} rps provider ({WORKERS} workers)",
        "/s",
        m["goodput"],
        RPS,
        f"the provider's limit, {RPS:g}/s",
        GOODPUT,
    )
    requests, refused = m["stats"]["requests"], m["stats"]["by_status"].get("429", 0)
    share = refused / requests if requests else 0.0
    result.notes = [
        (
            f"steady goodput {m['goodput']:.1f}/s >= {GOODPUT * RPS:.1f}/s over {m['window']:.1f}s (rows {STEADY[0]:.0%}-"
            f"{STEADY[1]:.0%} admitted); {SHARED_ROWS - m['ok']} rows not ok",
            m["goodput"] >= GOODPUT * RPS and m["ok"] == SHARED_ROWS,
        ),
        (f"429s {share:.1%} of {requests} requests <= {REFUSED:.0%}", share <= REFUSED),
        (
            f"whole sending period {m['sending']:.1f}s: {m['whole']:.1f}/s incl. the burst of {DEMO['burst']:g}; map {m['map']:.1f}s",
            None,
        ),
    ]
    return result


def _clock_row(name: str, settings: dict[str, Any], m: dict[str, Any], floor: float, most: float) -> Result:
    result = clock_row(name, settings, m["stats"], floor)
    result.notes += [
        refused_note(m["stats"], most, m["rows"] - m["ok"]),
        (f"{SHARED_PARTITIONS} partitions; map {m['map']:.1f}s", None),
    ]
    return result


def _median(runs: list[dict[str, Any]], by: str) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r[by])[(len(runs) - 1) // 2]
