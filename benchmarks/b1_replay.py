"""B1: replaying a finished job from disk.

- receipts replay: 20,000 rows whose row memos miss (a new play version) and whose one tool
  call each hits its receipt; the row memos are written as they finish.
- row-memo replay: the same 20,000 rows, every row memo hits.
- fixture replay: the same 20,000 rows replayed from a fixture file (``pb.fixtures(path)``):
  every row runs, every call is answered from it; compared with the row-memo replay of the same
  rows (a replay that runs no play at all), measured in the same run.  A process parses a file
  once per version of it; the second fixture line times a file not read yet (its parse included).

Baseline: raw ``diskcache.Cache(disk=JSONDisk).get`` of 20,000 keys, the store the design names
("diskcache with JSON serialisation").  A second, stricter floor is printed too: ``get`` of JSON
*text* under str keys plus ``json.loads`` (what playbook's own store does underneath).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import tempfile
from collections.abc import Callable

import diskcache
import pandas as pd

import playbook as pb
from playbook.store import engine

from .harness import Result, compare, timed

ROWS = 20_000


def replays(
    store: pb.ReceiptStore, fixtures: str
) -> tuple[Callable[[], int], Callable[[], int], Callable[..., int]]:
    """Fill ``store`` with ROWS rows' receipts and memos, and record them to ``fixtures``; return
    the three replays (each returns its rows)."""

    @pb.tool(name="lookup", version="1")
    async def lookup(n: int) -> dict:
        return {"n": n, "label": f"item-{n}"}

    async def replay(row, ctx):
        return {"v": await ctx.tool(lookup, n=row.n)}

    frame = pd.DataFrame({"n": range(ROWS), "name": [f"row {i}" for i in range(ROWS)]})
    versions = itertools.count()
    with pb.fixtures(fixtures, mode="record"):
        frame.play.map(
            pb.play(replay, name="replay", version=str(next(versions))), store=store, progress=False
        )
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

    copies = itertools.count()

    def fixture_replay(cold: bool = False) -> int:
        path = fixtures
        if cold:  # a file this process has not read yet (a new copy): its parse is timed too
            path = f"{fixtures}.{next(copies)}"
            shutil.copyfile(fixtures, path)
        run = frame.play.run(memo_play, fixtures=pb.fixtures(path), progress=False, concurrency=16)
        assert run.stats.ok == ROWS and run.stats.calls_local == ROWS, run.stats
        return len(run.result)

    return receipts_replay, memo_replay, fixture_replay


def run(repeats: int = 3) -> list[Result]:
    workdir = tempfile.mkdtemp(prefix="pb-b1-")
    store = pb.ReceiptStore(workdir + "/store")
    receipts_replay, memo_replay, fixture_replay = replays(store, workdir + "/fixtures.jsonl")

    # The baselines hold the very receipts the replay reads, under the same keys.
    records = {key: record for key, record in engine(store).records()}
    assert len(records) == ROWS
    keys = list(records)
    random.Random(0).shuffle(keys)
    json_cache = diskcache.Cache(workdir + "/jsondisk", disk=diskcache.JSONDisk)
    text_cache = diskcache.Cache(workdir + "/text")
    with json_cache.transact(), text_cache.transact():
        for k in keys:
            json_cache.set(k, records[k])
            text_cache.set(k, json.dumps(records[k]))

    def raw_json_gets() -> int:
        get = json_cache.get
        for k in keys:
            get(k)
        return len(keys)

    def raw_text_gets() -> int:
        get, loads = text_cache.get, json.loads
        for k in keys:
            loads(get(k))
        return len(keys)

    results = [
        compare(
            "B1 receipts replay (20k rows)",
            lambda: timed(receipts_replay),
            lambda: timed(raw_json_gets),
            unit="/s",
            baseline_name="diskcache JSONDisk get",
            target=0.5,
            repeats=repeats,
        ),
        compare(
            "B1 row-memo replay (20k rows)",
            lambda: timed(memo_replay),
            lambda: timed(raw_json_gets),
            unit="/s",
            baseline_name="diskcache JSONDisk get",
            target=0.8,
            repeats=repeats,
        ),
        compare(
            "B1 fixture replay (20k rows)",
            lambda: timed(fixture_replay),
            lambda: timed(memo_replay),
            unit="/s",
            baseline_name="row-memo replay",
            target=0.5,
            repeats=repeats,
        ),
        compare(
            "B1 fixture replay, file read too",
            lambda: timed(lambda: fixture_replay(cold=True)),
            lambda: timed(memo_replay),
            unit="/s",
            baseline_name="row-memo replay",
            target=0.0,
            repeats=repeats,
        ),
        compare(
            "B1 receipts replay vs text floor",
            lambda: timed(receipts_replay),
            lambda: timed(raw_text_gets),
            unit="/s",
            baseline_name="diskcache str get + json.loads",
            target=0.0,
            repeats=repeats,
        ),
        compare(
            "B1 row-memo replay vs text floor",
            lambda: timed(memo_replay),
            lambda: timed(raw_text_gets),
            unit="/s",
            baseline_name="diskcache str get + json.loads",
            target=0.0,
            repeats=repeats,
        ),
    ]
    store.close()
    return results
