"""ReceiptStore: hits, misses, None results, TTL, JSON-only storage, inspection, format."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

import playbook as pb
from playbook.receipts import MISSING


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _counting_tool(calls: list[str], result: object = "value") -> pb.Tool:
    @pb.tool(name="lookup")
    def lookup(q: str) -> object:
        calls.append(q)
        return result

    return lookup


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"q": ["a", "b", "c"]})


def test_miss_then_hit(store: pb.ReceiptStore) -> None:
    """The first call dispatches and writes a receipt; the same call in a new play hits it."""
    calls: list[str] = []
    lookup = _counting_tool(calls)

    @pb.play
    async def first(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    @pb.play
    async def second(row, ctx):
        return {"w": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(first, store=store, progress=False)
    out = _frame().play.map(second, store=store, progress=False)
    assert calls == ["a", "b", "c"]
    assert list(out["w"]) == ["value"] * 3
    stats = pb.last_run().stats
    assert (stats.calls_executed, stats.calls_reused) == (0, 3)
    receipt = store.get(lookup, q="a")
    assert receipt is not None and receipt.output == "value" and receipt.miss is False


def test_none_result_is_a_receipt(store: pb.ReceiptStore) -> None:
    """A tool that returns None is recorded as a miss and is not called again."""
    calls: list[str] = []
    lookup = _counting_tool(calls, result=None)

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, row.q)}

    _frame().play.map(find, store=store, progress=False)
    _frame().play.map(find, store=store, progress=False, refresh="rows")
    assert calls == ["a", "b", "c"]
    receipt = store.get(lookup, "b")
    assert receipt is not None and receipt.output is None and receipt.miss is True
    assert store.lookup("r-not-a-key") is MISSING


def test_ttl_makes_receipts_stale(tmp_path: Path) -> None:
    """A receipt older than ttl seconds is a miss; a younger one hits."""
    clock = Clock()
    store = pb.ReceiptStore(tmp_path / "s", clock=clock)
    calls: list[str] = []
    lookup = _counting_tool(calls)

    @pb.play
    async def fresh(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q, ttl=60)}

    frame = pd.DataFrame({"q": ["a"]})
    frame.play.map(fresh, store=store, progress=False)
    clock.now += 30
    frame.play.map(fresh, store=store, progress=False, refresh="rows")
    assert calls == ["a"]
    clock.now += 31
    frame.play.map(fresh, store=store, progress=False, refresh="rows")
    assert calls == ["a", "a"]


def test_store_holds_no_pickle(store: pb.ReceiptStore) -> None:
    """Every value in the SQLite table is JSON text; no entry uses diskcache's pickle mode."""
    lookup = _counting_tool([], result={"nested": [1, 2.5, None, "x"]})

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    store.flush()
    con = sqlite3.connect(store.path / "cache.db")
    rows = con.execute("SELECT key, mode, value FROM Cache").fetchall()
    memos = con.execute("SELECT value FROM playbook_memo").fetchall()
    con.close()
    assert len(rows) == 1 + 3 and len(memos) == 3  # format marker, receipts; row memos
    assert {mode for _, mode, _ in rows} <= {1, 3}  # MODE_RAW text (or text file), never 4 = pickle
    for value in [v for _, _, v in rows] + [v for (v,) in memos]:
        assert isinstance(value, (str, int)) and json.loads(str(value)) is not None


def test_pickled_value_is_refused(store: pb.ReceiptStore) -> None:
    """A pickled entry written by something else is refused with a ReceiptError, never loaded."""
    import diskcache

    raw = diskcache.Cache(str(store.path))
    raw.set("r0000", {"a": object.__new__(object).__class__})  # forces pickle mode
    raw.close()
    with pytest.raises(pb.ReceiptError, match="non-JSON"):
        store.lookup("r0000")


def test_newer_format_is_a_clear_error(tmp_path: Path) -> None:
    """A store written by a newer format version raises ReceiptError naming both versions."""
    store = pb.ReceiptStore(tmp_path / "s")
    store._cache.set("playbook/format", 99)
    store.close()
    with pytest.raises(pb.ReceiptError, match="format 99"):
        pb.ReceiptStore(tmp_path / "s")


def test_unopenable_store_is_a_clear_error(tmp_path: Path) -> None:
    """A store path that is a file raises ReceiptError naming the path."""
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    with pytest.raises(pb.ReceiptError, match="not-a-dir"):
        pb.ReceiptStore(target)


def test_receipts_stats_and_clear(store: pb.ReceiptStore) -> None:
    """receipts() lists inputs and outputs per tool; clear(tool) removes only that tool's."""
    one = _counting_tool([], result="1")

    @pb.tool(name="other", cost=0.5)
    def other(q: str) -> str:
        return q.upper()

    @pb.play
    async def both(row, ctx):
        return {"a": await ctx.tool(one, q=row.q), "b": await ctx.tool(other, q=row.q)}

    _frame().play.map(both, store=store, progress=False)
    frame = store.receipts("other")
    assert sorted(frame["output"]) == ["A", "B", "C"]
    assert frame["input"].tolist()[0] in ({"q": "a"}, {"q": "b"}, {"q": "c"})
    stats = store.stats()
    assert stats["by_tool"] == {"lookup": 3, "other": 3}
    assert stats["row_memos"] == 3 and stats["cost_stored"] == 1.5
    assert store.clear("other") == 3
    assert store.stats()["by_tool"] == {"lookup": 3}
    store.clear()
    assert store.stats()["receipts"] == 0


def test_receipt_is_committed_before_the_row_continues(store: pb.ReceiptStore) -> None:
    """When ctx.tool returns, its receipt is already visible to another connection."""
    lookup = _counting_tool([])
    seen: list[bool] = []

    @pb.play
    async def check(row, ctx):
        await ctx.tool(lookup, q=row.q)
        other = sqlite3.connect(store.path / "cache.db")
        (count,) = other.execute("SELECT COUNT(*) FROM Cache WHERE tag = 'lookup' AND value LIKE ?", (f'%"in":{{"q":"{row.q}"}}%',)).fetchone()
        other.close()
        seen.append(count == 1)

    pd.DataFrame({"q": [f"k{i}" for i in range(40)]}).play.map(check, store=store, progress=False, concurrency=20)
    assert seen == [True] * 40
