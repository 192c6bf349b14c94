"""B6: one provider account, many processes.  The demo provider (its own process) enforces the
account's limits; worker processes (``workers``) each map their share of the rows (distinct
inputs, a store of their own) from one start line, their limits shared through a throwaway
redis-server (``playbook.demo.redis_server``), flushed before each run.

  B6    a 20/s token bucket (burst 10), 8 requests in flight, 0.2 s per answer.  Two, then four
        processes map 300 rows in all through ``pb.Provider("demo", rps=20, concurrency=8,
        shared=<redis>)``.
          shared=redis://... (ours)   goodput >= 0.95 x 20/s combined; 429s <= 2% of requests;
                                      at most 8 in flight at the demo; 0 duplicate dispatches
          shared=None (the baseline)  the same processes, each pacing alone: printed for reference
        Goodput is rows ok per second from the start line to the last worker's end.  A duplicate
        dispatch is a call the demo admitted (answered other than 429) more than once: admitted
        requests less rows.  The ratio is ours over the baseline's goodput.

  B6.2  a strict bucket: 20/s, burst 2, 8 requests in flight, 0.15 s per answer.  Four processes
        from one start line, through ``pb.Provider("demo", concurrency=8, shared=<redis>)``:
          rps=20, 100 rows each          >= 0.95 on the provider's clock, 429s <= 2%, at most 8
                                         in flight at the demo
          rate not configured,           the steady state after it converged >= 0.9 x 20/s, 429s
          200 rows each (>= 30 s)        <= 5% over the run; the time to converge printed apart
          rps=20, jitter: a few 429s     >= 0.95 on the provider's clock, 429s <= 2%: four calls
          with Retry-After: 1            the network bunched, three of them within half a second
                                         (the demo's seeded fault_status=429 draws, answered
                                         "Retry-After: 1" in whole seconds), are jitter: each
                                         refused call waits its second, the shared rate holds

  B6.3  a fixed window of 50 calls per aligned 5 s, 0.05 s per answer.  Two processes, 200 rows
        each, through ``pb.Provider("demo", shared=<redis>)``:
          window=(50, 5)                 >= 0.95 of ideal on the provider's clock, no 429
          window unknown                 elapsed on the provider's clock <= 1.2 x ideal, 429s <= 5%

  B6.4  on a Redis Cluster of 3 masters (each with a replica, ``RedisClusterServer``) beside the
        one server, measured in the same run, one after the other: the limits shared on each.
          B6.2's strict bucket, rps=20       >= 0.95 on the provider's clock, 429s <= 2%, at most 8
          (4 processes, 100 rows each)       in flight at the demo; the one server's figures beside
          B6's bucket, 4 processes           goodput >= 0.95 x the one server's in this run (and
                                             >= 0.95 x 20/s), 429s <= 2%, at most 8 in flight
        Each process keeps its store where B6 keeps it (a directory of its own) unless
        ``STORE_ON_CLUSTER``: then on the cluster too.  ``B6_ONLY=cluster`` runs these rows alone.

On the provider's clock (B6.2, B6.3) is where the limit is enforced: the demo counts the requests
it admitted past every limit and the seconds between the first and the last; the ideal seconds
are (admitted - burst) / rps for a bucket, (admitted - 50) / (50 / 5 s) for the window, and the
ratio is ideal over admitted seconds.  It is those rows' ratio column (ours: the rate it amounts
to; the baseline: the limit).  A rate not configured is read from the demo's admitted count,
sampled every 0.1 s: it has converged once the rate over every sliding 3 s holds >= 0.9 x 20/s
until 95% of the requests are in; the target is on the rate from then on.  Processes mapping the
same rows are ``b6_same_rows``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer

from .harness import (
    Result,
    clock_row,
    convergence,
    demo_process,
    emptied,
    on_providers_clock,
    refused_note,
    steady_row,
)
from .workers import Finish, Worker, start_line

ROWS = 300
RPS = 20.0
IN_FLIGHT = 8
DEMO = {"rps": RPS, "burst": 10, "max_in_flight": IN_FLIGHT, "latency": 0.2}
GOODPUT = 0.95  # of RPS
REFUSED = 0.02  # of requests
BASELINE = "shared=None (each process paces alone)"

STRICT = {"rps": RPS, "burst": 2, "max_in_flight": IN_FLIGHT, "latency": 0.15}
STRICT_PROCESSES = 4
STRICT_ROWS = 100  # per process, rps=20
LEARNING_ROWS = 200  # per process, the rate not configured: 800 rows at 20/s, 40 s
# Four requests of the first ~420 that pass the bucket are refused as a strict bucket refuses a
# call the network bunched, with "Retry-After: 1" (the seed puts three of them within ten requests)
JITTER = {**STRICT, "fault_status": 429, "fault_rate": 0.0075, "fault_retry_after": 1.0, "seed": 53}
STEADY = 0.9  # of RPS, after it converged
LEARNING_REFUSED = 0.05  # of requests

WINDOW = {"window_limit": 50, "window_seconds": 5.0, "latency": 0.05}
WINDOW_PROCESSES = 2
WINDOW_ROWS = 200  # per process
KNOWN_FLOOR = 0.95  # of ideal
UNKNOWN_FLOOR = 1 / 1.2  # elapsed <= 1.2 x ideal
UNKNOWN_REFUSED = 0.05  # of requests

CLUSTER_PROCESSES = 4
STORE_ON_CLUSTER = True  # each process's store on the cluster too (False: a directory of its own)
Redis = RedisServer | RedisClusterServer


def run(repeats: int = 1) -> list[Result]:
    with demo_process() as url, RedisServer() as redis, RedisClusterServer() as cluster:
        if os.environ.get("B6_ONLY") == "cluster":
            return _clusters(url, redis, cluster, repeats)
        return _single(url, redis, repeats) + _clusters(url, redis, cluster, repeats)


def _single(url: str, redis: RedisServer, repeats: int) -> list[Result]:
    """B6, B6.2 and B6.3 on one Redis server."""
    results = []
    for count in (2, 4):
        ours, base = [], []
        for _ in range(repeats):
            alone = _split({"rps": RPS, "concurrency": IN_FLIGHT}, count, ROWS // count)
            base.append(_measured(url, redis, DEMO, alone))
            shared = _split({"rps": RPS, "concurrency": IN_FLIGHT}, count, ROWS // count, redis)
            ours.append(_measured(url, redis, DEMO, shared))
        results.append(_row(count, _median(ours), _median(base)))
    results += _strict(url, redis, repeats)
    results += _windows(url, redis, repeats)
    return results


def _clusters(url: str, redis: RedisServer, cluster: RedisClusterServer, repeats: int) -> list[Result]:
    """B6.4: B6.2's strict bucket and B6's bucket, 4 processes, on the one server then on the
    cluster, one after the other in each repeat (a slow spell of the machine hits both)."""
    told: dict[str, list[Finish]] = {"server": [], "cluster": []}
    bucket: dict[str, list[Finish]] = {"server": [], "cluster": []}
    options = {"rps": RPS, "concurrency": IN_FLIGHT}
    for _ in range(repeats):
        for name, where in (("server", redis), ("cluster", cluster)):
            told[name].append(
                _measured(url, where, STRICT, _split(options, CLUSTER_PROCESSES, STRICT_ROWS, where))
            )
            bucket[name].append(
                _measured(
                    url, where, DEMO, _split(options, CLUSTER_PROCESSES, ROWS // CLUSTER_PROCESSES, where)
                )
            )
    who = f"B6.4 {CLUSTER_PROCESSES} procs on a 3-master cluster"
    mine, one = (_median(told[name], key=lambda f: _on_clock(STRICT, f)) for name in ("cluster", "server"))
    strict = clock_row(f"{who}, burst 2: rps=20", STRICT, mine.stats, GOODPUT)
    strict.notes += [
        refused_note(mine.stats, REFUSED, mine.rows - mine.ok),
        _in_flight_note(mine),
        (f"one Redis server in this run: {_server_figures(one, _on_clock(STRICT, one) * RPS)}", None),
    ]
    mine, one = (_median(bucket[name]) for name in ("cluster", "server"))
    shared = Result(
        f"{who}, burst 10", "/s", mine.goodput, one.goodput, "one Redis server, this run", GOODPUT
    )
    shared.notes = [
        *_shared_notes(mine),
        (f"one Redis server in this run: {_server_figures(one, one.goodput)}", None),
    ]
    return [strict, shared]


def _shared_notes(mine: Finish) -> list[tuple[str, bool | None]]:
    """What every shared row is judged on: goodput, 429s, calls in flight, duplicate dispatches."""
    floor = GOODPUT * RPS
    return [
        (
            f"goodput {mine.goodput:.1f}/s >= {floor:.1f}/s ({GOODPUT:.2f} x {RPS:g}/s); {mine.rows - mine.ok} rows not ok",
            mine.goodput >= floor and mine.ok == mine.rows,
        ),
        (
            f"429s {mine.refused_share:.1%} of {mine.requests} requests <= {REFUSED:.0%}",
            mine.refused_share <= REFUSED,
        ),
        _in_flight_note(mine),
        (f"duplicate dispatches {_duplicates(mine)}", _duplicates(mine) == 0),
    ]


def _server_figures(finish: Finish, rate: float) -> str:
    return (
        f"{rate:.1f}/s, 429s {finish.refused_share:.1%} of {finish.requests}, "
        f"max in flight {finish.stats['max_in_flight']}, {finish.rows - finish.ok} rows not ok"
    )


def _row(count: int, mine: Finish, base: Finish) -> Result:
    result = Result(f"B6 {count} processes, shared", "/s", mine.goodput, base.goodput, BASELINE, 1.0)
    result.notes = [
        *_shared_notes(mine),
        (
            f"baseline: {base.goodput:.1f}/s, 429s {base.refused_share:.0%} of {base.requests}, "
            f"max in flight {base.stats['max_in_flight']}, {base.rows - base.ok} rows not ok",
            None,
        ),
    ]
    return result


def _strict(url: str, redis: RedisServer, repeats: int) -> list[Result]:
    """B6.2: four processes on a bucket of 2, told the rate, then not; told it, with jitter."""
    told, learning, jittered = [], [], []
    for _ in range(repeats):
        jittered.append(
            _measured(
                url,
                redis,
                JITTER,
                _split({"rps": RPS, "concurrency": IN_FLIGHT}, STRICT_PROCESSES, STRICT_ROWS, redis),
            )
        )
        told.append(
            _measured(
                url,
                redis,
                STRICT,
                _split({"rps": RPS, "concurrency": IN_FLIGHT}, STRICT_PROCESSES, STRICT_ROWS, redis),
            )
        )
        workers = _split({"concurrency": IN_FLIGHT}, STRICT_PROCESSES, LEARNING_ROWS, redis)
        learning.append(_measured(url, redis, STRICT, workers, watch=True))
    who = f"B6.2 {STRICT_PROCESSES} procs, burst 2"
    mine = _median(told, key=lambda f: _on_clock(STRICT, f))
    configured = clock_row(f"{who}: rps=20", STRICT, mine.stats, GOODPUT)
    configured.notes += [refused_note(mine.stats, REFUSED, mine.rows - mine.ok), _in_flight_note(mine)]
    mine = _median(learning, key=lambda f: convergence(f.admitted, RPS).rate)
    discovered = steady_row(f"{who}: discovered", STRICT, mine.stats, mine.admitted, STEADY)
    discovered.notes += [
        refused_note(mine.stats, LEARNING_REFUSED, mine.rows - mine.ok),
        _in_flight_note(mine),
    ]
    mine = _median(jittered, key=lambda f: _on_clock(JITTER, f))
    jitter = clock_row(f"{who}: rps=20, jitter", JITTER, mine.stats, GOODPUT)
    jitter.notes += [refused_note(mine.stats, REFUSED, mine.rows - mine.ok), _in_flight_note(mine)]
    return [configured, discovered, jitter]


def _windows(url: str, redis: RedisServer, repeats: int) -> list[Result]:
    """B6.3: two processes on a fixed window, told it, then not."""
    known, unknown = [], []
    for _ in range(repeats):
        known.append(
            _measured(url, redis, WINDOW, _split({"window": (50, 5)}, WINDOW_PROCESSES, WINDOW_ROWS, redis))
        )
        unknown.append(_measured(url, redis, WINDOW, _split({}, WINDOW_PROCESSES, WINDOW_ROWS, redis)))
    results = []
    for label, runs, floor, most in (
        ("window=(50, 5)", known, KNOWN_FLOOR, 0.0),
        ("window unknown", unknown, UNKNOWN_FLOOR, UNKNOWN_REFUSED),
    ):
        mine = _median(runs, key=lambda f: _on_clock(WINDOW, f))
        result = clock_row(f"B6.3 {WINDOW_PROCESSES} procs: {label}", WINDOW, mine.stats, floor)
        result.notes.append(refused_note(mine.stats, most, mine.rows - mine.ok))
        results.append(result)
    return results


# -- running and reading ----------------------------------------------------------------------


def _measured(
    url: str, redis: Redis, settings: dict[str, Any], workers: list[Worker], *, watch: bool = False
) -> Finish:
    """One run from a start line, on a flushed Redis: what one run's limiter learnt is not the next one's."""
    if isinstance(redis, RedisServer):
        emptied(redis)
    else:
        redis.flush()
        if STORE_ON_CLUSTER:  # a store emptied on purpose, not one that lost its receipts
            store = pb.ReceiptStore(redis.url)
            store.accept_loss()
            store.close()
    return start_line(url, settings, workers, watch=watch)


def _split(provider: dict[str, Any], count: int, rows: int, redis: Redis | None = None) -> list[Worker]:
    """``count`` workers of ``rows`` distinct rows each, through ``pb.Provider("demo", **provider)``,
    their limits shared at ``redis`` (None: each process's own); on a cluster, their store too
    when ``STORE_ON_CLUSTER``."""
    options = {**provider, "shared": redis.url if redis is not None else None}
    store = redis.url if isinstance(redis, RedisClusterServer) and STORE_ON_CLUSTER else None
    return [Worker(options, i * rows, rows, store=store) for i in range(count)]


def _on_clock(settings: dict[str, Any], finish: Finish) -> float:
    return on_providers_clock(settings, finish.stats)


def _in_flight_note(finish: Finish) -> tuple[str, bool]:
    seen = finish.stats["max_in_flight"]
    return f"max in flight at the demo {seen} <= {IN_FLIGHT}", seen <= IN_FLIGHT


def _duplicates(finish: Finish) -> int:
    """Calls the demo admitted more than once: admitted requests (answered other than 429) less rows."""
    return finish.requests - finish.refused - finish.rows


def _median(runs: list[Finish], key: Callable[[Finish], float] = lambda f: f.goodput) -> Finish:
    return sorted(runs, key=key)[(len(runs) - 1) // 2]
