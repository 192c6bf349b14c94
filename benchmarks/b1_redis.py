"""B1 on Redis: the same replays as B1, with the receipt store on a real Redis server (a local
``redis-server`` on loopback, appendonly on, as the README advises).

- receipts replay: 20,000 rows whose row memos miss and whose one tool call each hits its receipt;
- row-memo replay: the same rows, every row memo hits.

Baseline: what a hand-written client of the same server does at best: the very records
playbook keeps, as JSON text under the same keys, read back with ``GET`` pipelined 1,000 keys a
round trip, then ``json.loads``.  Target: >= 0.5 of it for the receipts replay.
"""

from __future__ import annotations

import itertools
import json
import random

import pandas as pd
import redis

import playbook as pb
from playbook.demo.redis_server import RedisServer

from .harness import Result, compare, timed

ROWS = 20_000


def run(repeats: int = 3) -> list[Result]:
    with RedisServer() as server:
        return _run(server.url, repeats)


def _run(url: str, repeats: int) -> list[Result]:
    store = pb.ReceiptStore(url)

    @pb.tool(name="lookup", version="1")
    async def lookup(n: int) -> dict:
        return {"n": n, "label": f"item-{n}"}

    async def replay(row, ctx):
        return {"v": await ctx.tool(lookup, n=row.n)}

    frame = pd.DataFrame({"n": range(ROWS), "name": [f"row {i}" for i in range(ROWS)]})
    versions = itertools.count()
    frame.play.map(pb.play(replay, name="replay", version=str(next(versions))), store=store, progress=False)
    memo_play = pb.play(replay, name="replay", version="memo")
    frame.play.map(memo_play, store=store, progress=False)

    def receipts_replay() -> int:
        fresh = pb.play(replay, name="replay", version=str(next(versions)))
        run = frame.play.run(fresh, store=store, progress=False, concurrency=16)
        assert run.stats.calls_reused == ROWS and run.stats.calls_executed == 0
        return len(run.result)

    def memo_replay() -> int:
        run = frame.play.run(memo_play, store=store, progress=False)
        assert run.stats.reused == ROWS
        return len(run.result)

    # The baseline reads the very receipts the replay reads, as JSON text under the same keys.
    client = redis.Redis.from_url(url)
    records = {key: record for key, record in store.records()}
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

    results = [
        compare("B1r receipts replay (Redis)", lambda: timed(receipts_replay), lambda: timed(pipelined_gets),
                unit="/s", baseline_name="redis-py pipelined GET + json.loads", target=0.5, repeats=repeats),
        compare("B1r row-memo replay (Redis)", lambda: timed(memo_replay), lambda: timed(pipelined_gets),
                unit="/s", baseline_name="redis-py pipelined GET + json.loads", target=0.5, repeats=repeats),
    ]  # fmt: skip
    client.close()
    store.close()
    return results
