"""B6r: processes that map the same rows share them.  1, 2 and 4 worker processes (``workers``)
each map THE SAME 2,000 rows (an identical frame) on one store, from one start line, through the
demo provider (its own process; 0.1 s per answer, no limits: the provider is not the bottleneck)
at ``concurrency=16`` each, under a ``pb.Provider("demo")`` of their own.  Once on a store
directory (SQLite) that every process opens, once on a Redis store (``store="redis://..."``, a
throwaway redis-server, flushed before each run); every run starts on an empty store.

     contender                    targets
     2 and 4 processes (ours)     N processes take <= 1.25 / N of one process's time on the same
                                  store; every row ok in every process (or reused: another process
                                  finished its call); 0 duplicate dispatches
     1 process (the baseline)

Time is from the start line (every worker warmed up and waiting) to the last process's end; the
ratio is ours over the baseline in rows per second (of the 2,000), so the target is N / 1.25.  A
duplicate dispatch is a call the demo saw twice: its ``/_stats`` ``duplicate_idempotency_keys``
must be 0 (a call's idempotency key is the same in every process) and its ``requests`` 2,000.
Medians over ``repeats``, interleaved; one repetition takes ~1 min.
"""

from __future__ import annotations

import tempfile

from playbook.demo.redis_server import RedisServer

from .harness import Result, demo_process, emptied
from .workers import Finish, Worker, start_line

ROWS = 2_000
DEMO = {"latency": 0.1}
CONCURRENCY = 16  # per process
PROCESSES = (1, 2, 4)
SLACK = 1.25  # N processes take at most SLACK / N of one process's time


def run(repeats: int = 1) -> list[Result]:
    runs: dict[tuple[str, int], list[Finish]] = {}
    with demo_process() as url, RedisServer() as redis:
        for _ in range(repeats):  # interleaved, so a slow spell of the machine hits every count
            for kind in ("sqlite", "redis"):
                for count in PROCESSES:
                    runs.setdefault((kind, count), []).append(_measured(url, redis, kind, count))
    results = []
    for kind in ("sqlite", "redis"):
        one = _median(runs[kind, 1])
        results += [_row(kind, count, _median(runs[kind, count]), one) for count in PROCESSES[1:]]
    return results


def _measured(url: str, redis: RedisServer, kind: str, count: int) -> Finish:
    """``count`` processes over the same rows on a new store of ``kind``."""
    if kind == "redis":
        emptied(redis)
        return start_line(url, DEMO, _same(count, redis.url))
    with tempfile.TemporaryDirectory(prefix="pb-b6r-") as home:
        return start_line(url, DEMO, _same(count, home))


def _same(count: int, store: str) -> list[Worker]:
    return [Worker({}, 0, ROWS, store=store, concurrency=CONCURRENCY) for _ in range(count)]


def _row(kind: str, count: int, mine: Finish, one: Finish) -> Result:
    target = count / SLACK
    result = Result(
        f"B6r same rows, {count} procs, {kind}",
        "/s",
        ROWS / mine.seconds,
        ROWS / one.seconds,
        "1 process, the same store",
        target,
    )
    within = SLACK / count * one.seconds
    result.notes = [
        (
            f"{count} processes {mine.seconds:.1f}s <= {SLACK:g}/{count} x one process's {one.seconds:.1f}s = {within:.1f}s; "
            f"{_done(mine)}",
            mine.seconds <= within and mine.done == mine.rows,
        ),
        _dispatch_note(mine),
        (f"one process: {_dispatch_note(one)[0]}; {_done(one)}", None),
    ]
    return result


def _dispatch_note(finish: Finish) -> tuple[str, bool]:
    requests, duplicates = finish.requests, finish.stats["duplicate_idempotency_keys"]
    return (
        f"the demo saw {requests:,} requests (== {ROWS:,}), {duplicates} duplicate idempotency keys",
        requests == ROWS and duplicates == 0,
    )


def _done(finish: Finish) -> str:
    reused = finish.statuses.get("reused", 0)
    return f"{finish.done:,} of {finish.rows:,} rows ok or reused ({reused:,} reused)"


def _median(runs: list[Finish]) -> Finish:
    return sorted(runs, key=lambda f: f.seconds)[(len(runs) - 1) // 2]
