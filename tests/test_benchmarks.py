"""The benchmarks' logic that needs no timing: the baselines' loops return what they should, in
order, and the verdicts count what they say."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pandas as pd

import playbook as pb
from benchmarks import b1_redis, b1r_kept, b10_kept, b10_scale
from benchmarks.b11_estimate import seeds_result
from benchmarks.harness import worker_pool


def test_worker_pool_keeps_order_and_its_workers() -> None:
    """The worker pool returns each item's result in the items' order, never more than its workers at once."""
    running, most = 0, 0

    async def work(x: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (x % 7))  # later items finish first
        running -= 1
        return x * 10

    results = asyncio.run(worker_pool(iter(range(1000)), work, 1000, workers=16))
    assert results == [x * 10 for x in range(1000)]
    assert most == 16


def test_hand_loop_writes_then_reads_every_row(tmp_path: Path) -> None:
    """B10's worker loop writes every row's result under its key, and its reading loop reads them back in order."""
    db = sqlite3.connect(tmp_path / "loop.db")
    db.execute("CREATE TABLE receipts (key TEXT PRIMARY KEY, value TEXT)")
    values = list(range(2_500))
    for case in ("loop", "tasks"):
        _, written = b10_scale.hand_loop(db, values, case)
        assert written == [x * 2 for x in values]
    assert db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0] == len(values)
    _, read = b10_scale.hand_loop(db, values[::-1], "loop-read")
    assert read == [x * 2 for x in values[::-1]]


def test_kept_loop_pays_once_and_reads_ahead(tmp_path: Path) -> None:
    """The promise-keeping loop writes a receipt per call and a memo per row; a new version reads every receipt back."""
    path = str(tmp_path / "kept.db")
    values = list(range(1_300))  # three chunks read ahead, the last one short
    b10_kept.kept_loop(values, path, 256, "1")
    db = sqlite3.connect(path)
    receipts = dict(db.execute("SELECT key, value FROM receipt"))
    assert len(receipts) == len(values)
    assert sorted(json.loads(v) for v in receipts.values()) == [x * 2 for x in values]
    assert db.execute("SELECT COUNT(*) FROM lease").fetchone()[0] == 0
    b10_kept.kept_loop(values, path, 256, "2")
    assert dict(db.execute("SELECT key, value FROM receipt")) == receipts  # nothing paid again
    memos = [json.loads(v) for (v,) in db.execute("SELECT value FROM memo")]
    assert sorted(m["y"] for m in memos) == sorted([x * 2 for x in values] * 2)


def test_memo_read_reads_every_memo_of_a_store(tmp_path: Path) -> None:
    """B10's memo baseline reads back every row memo a playbook run left in its store."""

    @pb.tool(name="double", version="1")
    async def double(x: int) -> int:
        return x * 2

    async def doubled(row, ctx):  # type: ignore[no-untyped-def]
        return {"y": await ctx.tool(double, x=row.x)}

    pd.DataFrame({"x": range(600)}).play.map(
        pb.play(doubled, name="doubled"), store=tmp_path / "s", progress=False
    )
    read = sqlite3.connect(tmp_path / "s" / "receipts.db").execute("SELECT COUNT(*) FROM memo").fetchone()[0]
    assert read == 600
    assert b10_scale.memo_read(str(tmp_path / "s"), 600) > 0  # it asserts it read one per row


def test_b10_results_are_ratios_of_medians() -> None:
    """B10 judges each case by the median of its repeats over its baseline's median, and prints each repeat's ratio."""

    def m(rate: float) -> dict:
        return {"rate": rate, "base_kb": 100_000, "peak_kb": 100_100}

    samples = {
        "loop": [m(100), m(200), m(300)],
        "first": [m(10), m(90), m(60)],
        "memo-read": [m(100)] * 3,
        "memo": [m(40)] * 3,
        "loop-read": [m(100)] * 3,
        "receipts": [m(90)] * 3,
    }
    once = {
        "sqlite": {"insert": 1, "read": 1},
        "tasks": m(30),
        "kept": m(60),
        "kept-read": m(90),
        "failing": m(1),
    }
    first, receipts, memo = b10_scale.results(1_000, samples, once)
    assert (first.ratio, first.ok) == (60 / 200, False)
    assert (receipts.ratio, receipts.ok) == (0.9, True)
    assert (memo.ratio, memo.ok) == (0.4, False)
    assert "each repeat: 0.10, 0.45, 0.20" in [text for text, _ in first.notes]
    assert "ours 2.00 of it" in first.notes[1][0]  # against the loop with a task per row


def test_b11_verdict_is_the_share_of_seeds_within() -> None:
    """B11's verdict on a projection passes when 9 pilots of 10 land within the bound, and fails at 8."""
    nine = seeds_result("calls", [0.01, -0.14, 0.15, 0.0, 0.1, -0.05, 0.02, 0.03, 0.04, 0.3], 0.15)
    eight = seeds_result("calls", [0.01, -0.16, 0.15, 0.0, 0.1, -0.05, 0.02, 0.03, 0.04, 0.3], 0.15)
    assert (nine.ours, nine.baseline, nine.ok) == (9, 10, True)
    assert (eight.ours, eight.ok) == (8, False)


def test_redis_loops_write_then_read_every_row(redis_url: str) -> None:
    """B1r's worker loop reads back what it wrote; the promise-keeping loop pays each call once and reads them all ahead."""
    import redis

    values = list(range(1_300))
    b1_redis.worker_loop(redis_url, values, "write", 16)
    b1_redis.worker_loop(redis_url, values, "read", 16)  # it asserts the last row's value
    client = redis.Redis.from_url(redis_url)
    assert len(client.keys("loop:*")) == len(values)
    b1r_kept.kept_loop(redis_url, values, "t", "1", 16)
    receipts = {k: client.get(b"kept:" + k) for k in client.smembers("kept:tool:t")}
    assert sorted(json.loads(v)["n"] for v in receipts.values()) == values  # type: ignore[arg-type]
    assert client.keys("kept:lease:*") == []
    b1r_kept.kept_loop(redis_url, values, "t", "2", 16)
    assert {
        k: client.get(b"kept:" + k) for k in client.smembers("kept:tool:t")
    } == receipts  # nothing paid again
    assert client.scard("kept:memos") == 2 * len(values)
