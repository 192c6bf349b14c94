"""B1: replaying a finished job from disk.

- receipts replay: 20,000 rows whose row memos miss (a new play version) and whose one tool
  call each hits its receipt; the row memos are written as they finish.
- row-memo replay: the same 20,000 rows, every row memo hits.
- fixture replay: the same 20,000 rows replayed from a fixture file (``pb.fixtures(path)``):
  every row runs, every call is answered from it; compared with the row-memo replay of the same
  rows (a replay that runs no play at all), measured in the same run.  A process parses a file
  once per version of it; the second fixture line times a file not read yet (its parse included).

Baselines: the very records playbook keeps (a receipt is what both replays read: the memo replay's
memos hold the same output), as JSON text under the same keys in a SQLite table, read in random
order and each decoded with ``json.loads``: one keyed get each (what a careful script does, and a
stronger floor than diskcache's text ``get``), and SQLite's batched read (500 keys a query, each
chunk in key order).  Bounds (``TEXT``, ``BATCHED``): the receipts replay >= 0.8 of the keyed
gets and >= 0.5 of the batched read; the row-memo replay >= 1.0 of the keyed gets and >= 0.5 of
the batched read.  diskcache's ``JSONDisk`` get (zlib-compressed keys and values; the floor before
these) is printed under each replay's first row.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import sqlite3
import statistics
import tempfile
from collections.abc import Callable

import diskcache
import pandas as pd

import playbook as pb
from playbook.store import engine

from .harness import Result, compare, timed

ROWS = 20_000
CHUNK = 500  # keys a query in the batched read (as playbook's store asks them)
# The bounds, as a share of each floor's rate: a replayed row costs little more than the read that
# answers it.  Against a keyed get of each record (what a careful script does): as B10's receipts
# replay of the worker loop's reading; a memo replay, which reads its memos in batches, at least
# as fast.  Against SQLite's batched read of the same records: half of it, as B10's memo replay.
TEXT = {"receipts replay": 0.8, "row-memo replay": 1.0}
BATCHED = {"receipts replay": 0.5, "row-memo replay": 0.5}


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

    # The baselines hold the very receipts the replay reads, under the same keys, in random order.
    records = {key: record for key, record in engine(store).records()}
    assert len(records) == ROWS
    keys = list(records)
    random.Random(0).shuffle(keys)
    gets, batched = text_reads(workdir + "/text.db", {k: json.dumps(records[k]) for k in keys}, keys)
    json_cache = diskcache.Cache(workdir + "/jsondisk", disk=diskcache.JSONDisk)
    with json_cache.transact():
        for k in keys:
            json_cache.set(k, records[k])

    def jsondisk_gets() -> int:
        get = json_cache.get
        for k in keys:
            get(k)
        return len(keys)

    results = []
    for name, replay in (("receipts replay", receipts_replay), ("row-memo replay", memo_replay)):
        for baseline, baseline_name, target in (
            (gets, "SQLite keyed get + json.loads", TEXT[name]),
            (batched, "SQLite batched read + json.loads", BATCHED[name]),
        ):
            results.append(
                compare(
                    f"B1 {name} ({ROWS // 1000}k rows)" if baseline is gets else f"B1 {name} vs batched",
                    lambda replay=replay: timed(replay),
                    lambda baseline=baseline: timed(baseline),
                    unit="/s",
                    baseline_name=baseline_name,
                    target=target,
                    repeats=repeats,
                )
            )
    jsondisk = statistics.median(timed(jsondisk_gets) for _ in range(repeats))
    for result in results[::2]:
        result.notes.append(
            (
                f"diskcache JSONDisk get (the baseline before): {jsondisk:,.0f}/s, ours {result.ours / jsondisk:.2f} of it",
                None,
            )
        )
    results += [
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
    ]
    store.close()
    return results


def text_reads(
    path: str, texts: dict[str, str], keys: list[str]
) -> tuple[Callable[[], int], Callable[[], int]]:
    """The floors a careful script reads JSON text from: a SQLite table of ``texts`` (key: JSON
    text) at ``path``; returns two reads of ``keys`` in their order, each decoding every value: one
    keyed get each, and ``CHUNK`` keys a query (each chunk in key order, as playbook reads)."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE text (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    with db:
        db.executemany("INSERT INTO text VALUES (?, ?)", list(texts.items()))

    def gets() -> int:
        loads, cursor = json.loads, db.cursor()
        for k in keys:
            loads(cursor.execute("SELECT value FROM text WHERE key = ?", (k,)).fetchone()[0])
        return len(keys)

    def batched() -> int:
        loads, cursor, read = json.loads, db.cursor(), 0
        for start in range(0, len(keys), CHUNK):
            chunk = sorted(keys[start : start + CHUNK])
            marks = ",".join("?" * len(chunk))
            for _, value in cursor.execute(f"SELECT key, value FROM text WHERE key IN ({marks})", chunk):
                loads(value)
                read += 1
        return read

    return gets, batched
