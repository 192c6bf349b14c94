"""B1 on Redis: the same replays as B1, with the receipt store on a real Redis server (a local
``redis-server`` on loopback, appendonly on, as the README advises).

- receipts replay: 20,000 rows whose row memos miss and whose one tool call each hits its receipt;
- row-memo replay: the same rows, every row memo hits;
- first run: the same rows through a tool no receipt answers yet (a tool of its own each time:
  the replays' tool keeps its memos), so every call is made and its receipt and row memo written.

Baseline: what a hand-written client of the same server does at best: the very records
playbook keeps, as JSON text under the same keys, read back with ``GET`` pipelined 1,000 keys a
round trip, then ``json.loads``; for the first run, written with ``SET`` pipelined the same way.
Target: >= 0.5 of it for each.  Beside the first run and the receipts replay, the rate of a
hand-written asyncio loop on the same server keeping what playbook promises (``b1r_kept.py``).

And B10's bounds on the same server: the first run >= 0.6 and the receipts replay >= 0.8 of B10's
worker loop written for Redis (``worker_loop``: as many workers as the play's concurrency pulling
rows from one iterator, results sent a thousand to an ``MSET``, read back a ``GET`` each).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import statistics
import tempfile
import time

import pandas as pd
import redis

import playbook as pb
from playbook.demo.redis_server import RedisServer
from playbook.store import engine

from .b1_replay import ROWS, replays
from .b1r_kept import kept_loop
from .harness import Result, compare, timed, worker_pool

CONCURRENCY = 16
FIRST, RECEIPTS = 0.6, 0.8  # B10's bounds, against the worker loop on the same server


def worker_loop(url: str, values: list[int], case: str, workers: int) -> float:
    """B10's worker loop on Redis (rows per second): ``workers`` coroutines pulling rows from one
    iterator, a sha256 key per call; ``write``: the results sent a thousand at a time in one
    ``MSET``; ``read``: each row's result read back with a ``GET`` and ``json.loads``."""
    import asyncio

    import redis.asyncio as aredis

    async def main() -> float:
        client = aredis.Redis.from_url(url, max_connections=workers + 1)
        pending: dict[str, str] = {}

        def key(n: int) -> str:
            return "loop:" + hashlib.sha256(json.dumps(["lookup", "1", {"n": n}]).encode()).hexdigest()

        async def lookup(n: int) -> dict:
            return {"n": n, "label": f"item-{n}"}

        async def write(n: int) -> dict:
            value = await lookup(n)
            pending[key(n)] = json.dumps(value)
            if len(pending) >= 1000:
                batch = pending.copy()
                pending.clear()
                await client.mset(batch)
            return value

        async def read(n: int) -> dict:
            return json.loads(await client.get(key(n)))  # type: ignore[no-any-return]

        start = time.perf_counter()
        results = await worker_pool(values, write if case == "write" else read, len(values), workers)
        if pending:
            await client.mset(pending)
        seconds = time.perf_counter() - start
        assert results[-1] == {"n": values[-1], "label": f"item-{values[-1]}"}
        await client.aclose()
        return len(values) / seconds

    return asyncio.run(main())


def run(repeats: int = 3) -> list[Result]:
    with RedisServer() as server:
        return _run(server.url, repeats)


def _run(url: str, repeats: int) -> list[Result]:
    store = pb.ReceiptStore(url)
    receipts_replay, memo_replay, _ = replays(store, tempfile.mkdtemp(prefix="pb-b1r-") + "/fixtures.jsonl")

    # The baseline reads the very receipts the replay reads, as JSON text under the same keys.
    client = redis.Redis.from_url(url)
    records = {key: record for key, record in engine(store).records()}
    assert len(records) == ROWS
    keys = [f"raw:{k}" for k in records]
    random.Random(0).shuffle(keys)
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.set(key, json.dumps(records[key[4:]]))
        pipe.execute()

    def pipelined_gets() -> int:
        loads = json.loads
        for start in range(0, len(keys), 1000):
            with client.pipeline(transaction=False) as pipe:
                for key in keys[start : start + 1000]:
                    pipe.get(key)
                for text in pipe.execute():
                    loads(text)
        return len(keys)

    def pipelined_sets() -> int:
        dumps = json.dumps
        for start in range(0, len(keys), 1000):
            with client.pipeline(transaction=False) as pipe:
                for key in keys[start : start + 1000]:
                    pipe.set(key, dumps(records[key[4:]]))
                pipe.execute()
        return len(keys)

    frame = pd.DataFrame({"n": range(ROWS), "name": [f"row {i}" for i in range(ROWS)]})
    versions = itertools.count()

    def first_run() -> int:
        @pb.tool(name=f"first-{next(versions)}", version="1")
        async def lookup(n: int) -> dict:
            return {"n": n, "label": f"item-{n}"}

        async def first(row, ctx):
            return {"v": await ctx.tool(lookup, n=row.n)}

        run = frame.play.run(
            pb.play(first, name="first"), store=store, progress=False, concurrency=CONCURRENCY
        )
        assert run.stats.ok == ROWS and run.stats.calls_reused == 0, run.stats
        return len(run.result)

    ns = list(range(ROWS))
    results = [
        compare(
            "B1r first run vs worker loop",
            lambda: timed(first_run),
            lambda: worker_loop(url, ns, "write", CONCURRENCY),
            unit="/s",
            baseline_name="redis.asyncio worker loop, MSET",
            target=FIRST,
            repeats=repeats,
        ),
        compare(
            "B1r receipts replay vs worker loop",
            lambda: timed(receipts_replay),
            lambda: worker_loop(url, ns, "read", CONCURRENCY),
            unit="/s",
            baseline_name="redis.asyncio worker loop, GET",
            target=RECEIPTS,
            repeats=repeats,
        ),
        compare(
            "B1r first run (Redis)",
            lambda: timed(first_run),
            lambda: timed(pipelined_sets),
            unit="/s",
            baseline_name="redis-py pipelined SET",
            target=0.5,
            repeats=repeats,
        ),
        compare(
            "B1r receipts replay (Redis)",
            lambda: timed(receipts_replay),
            lambda: timed(pipelined_gets),
            unit="/s",
            baseline_name="redis-py pipelined GET + json.loads",
            target=0.5,
            repeats=repeats,
        ),
        compare(
            "B1r row-memo replay (Redis)",
            lambda: timed(memo_replay),
            lambda: timed(pipelined_gets),
            unit="/s",
            baseline_name="redis-py pipelined GET + json.loads",
            target=0.5,
            repeats=repeats,
        ),
    ]
    # The same rows through a loop that keeps what playbook promises (b1r_kept.py): its first
    # runs, then a new version of its play over the receipts the first of them left.
    kept_first = statistics.median(kept_loop(url, ns, f"kept-{i}", "1", CONCURRENCY) for i in range(repeats))
    kept_read = statistics.median(kept_loop(url, ns, "kept-0", "2", CONCURRENCY) for _ in range(repeats))
    for result, kept in ((results[0], kept_first), (results[1], kept_read)):
        result.notes = [
            (
                f"the loop keeping playbook's promises (b1r_kept.py): {kept:,.0f}/s, ours {result.ours / kept:.2f} of it",
                None,
            )
        ]
    client.close()
    store.close()
    return results
