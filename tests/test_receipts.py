"""ReceiptStore: hits, misses, None results, TTL, JSON-only storage, inspection, format."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import pickle
import sqlite3
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest

import playbook as pb
from playbook.keys import canonical, receipt_key
from playbook.receipts import FORMAT, MISSING


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


def test_pickled_value_is_refused(store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture) -> None:
    """A pickled entry written by something else is never loaded: it counts as missing, with a warning naming it."""
    import builtins

    import diskcache

    raw = diskcache.Cache(str(store.path))
    raw.set("r0000", _Planted())  # plain diskcache pickles what is not str, bytes or a number
    raw.close()
    assert store.lookup("r0000") is MISSING
    assert "receipt r0000" in caplog.text and "pickle, which playbook never loads" in caplog.text
    assert not hasattr(builtins, "_playbook_unpickled")


def test_newer_format_is_a_clear_error(tmp_path: Path) -> None:
    """A store written by a newer format version raises ReceiptError naming the path, both versions and what to do."""
    store = pb.ReceiptStore(tmp_path / "s")
    store._cache.set("playbook/format", 99)
    store.close()
    with pytest.raises(pb.ReceiptError) as info:
        pb.ReceiptStore(tmp_path / "s")
    message = str(info.value)
    assert str(tmp_path / "s") in message and "newer playbook" in message
    assert "format 99" in message and f"reads format {FORMAT}" in message
    assert "Upgrade playbook" in message and "another/directory" in message
    with closing(sqlite3.connect(tmp_path / "s" / "cache.db")) as con:  # refused, not rewritten
        assert con.execute("SELECT value FROM Cache WHERE key = 'playbook/format'").fetchone() == ("99",)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda db: db.write_bytes(b"SQLite format 2\x00" + bytes(range(256)) * 16), "is not a readable SQLite database"),
        (lambda db: db.write_bytes(db.read_bytes()[:2000]), "is not a readable SQLite database"),
        (lambda db: _sql(db, "UPDATE Cache SET value = '{\"v\":' WHERE key = 'playbook/format'"), "format marker cannot be read"),
        (lambda db: _sql(db, "UPDATE Cache SET value = '\"one\"' WHERE key = 'playbook/format'"), "format marker is 'one'"),
    ],
    ids=["garbage bytes", "truncated database", "format marker not JSON", "unknown format marker"],
)
def test_damaged_store_is_a_clear_error(tmp_path: Path, damage, problem: str) -> None:
    """A store whose database is not SQLite or whose format marker is damaged raises ReceiptError saying what to do."""
    _paid(pb.ReceiptStore(tmp_path / "s"), [], 10)
    damage(tmp_path / "s" / "cache.db")
    with pytest.raises(pb.ReceiptError) as info:
        pb.ReceiptStore(tmp_path / "s")
    message = str(info.value)
    assert message.startswith(f"cannot open the receipt store at {tmp_path / 's'}: ")
    assert problem in message and "Move it aside" in message and "another/directory" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # one paragraph, no chained traceback


def _sql(db: Path, statement: str, *args: object) -> None:
    with closing(sqlite3.connect(db)) as con, con:
        con.execute(statement, args)


def _paid(store: pb.ReceiptStore, calls: list[str], size: int) -> pb.Tool:
    """Pay for lookup(q) over a, b and c; each result is ``size`` characters (32 kB and up: a file)."""

    @pb.tool(name="lookup")
    def lookup(q: str) -> str:
        calls.append(q)
        return q * size

    out = _frame().play.map(lookup, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok"] * 3
    store.close()
    return lookup


class _Planted:
    """Unpickling this would run code: the store must never do it."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins._playbook_unpickled = True",))


def _key(q: str) -> str:
    return "r" + receipt_key("lookup", "1", canonical({"q": q}), "default")


def _value_file(store_path: Path, key: str) -> Path:
    with closing(sqlite3.connect(store_path / "cache.db")) as con:
        (filename,) = con.execute("SELECT filename FROM Cache WHERE key = ?", (key,)).fetchone()
    return store_path / filename


DAMAGE = {
    # name: (result size, damage(store path, key), what the error says)
    "inline JSON truncated": (10, lambda s, k: _sql(s / "cache.db", "UPDATE Cache SET value = substr(value, 1, 12) WHERE key = ?", k),
                              "not valid JSON"),
    "value file truncated": (40_000, lambda s, k: _value_file(s, k).write_text('{"v":1,"tool":"lookup","out":"aaa'),
                             "not valid JSON"),
    "value file missing": (40_000, lambda s, k: _value_file(s, k).unlink(), "is missing"),
    "value file not UTF-8": (40_000, lambda s, k: _value_file(s, k).write_bytes(b"\xff\xfe{}"), "not UTF-8"),
    "pickle planted": (10, lambda s, k: _sql(s / "cache.db", "UPDATE Cache SET mode = 4, value = ? WHERE key = ?",
                                             pickle.dumps(_Planted()), k), "pickle, which playbook never loads"),
    "JSON but not a receipt": (10, lambda s, k: _sql(s / "cache.db", "UPDATE Cache SET value = '{\"v\":1}' WHERE key = ?", k),
                               "not a format-1 receipt"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DAMAGE))
def test_unreadable_receipt_is_paid_again_not_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    """An unreadable receipt: get() raises a clear ReceiptError; a run re-pays only that call, warns, and heals the store."""
    import builtins

    size, damage, problem = DAMAGE[case]
    calls: list[str] = []
    lookup = _paid(pb.ReceiptStore(tmp_path / "s"), calls, size)
    key = _key("a")
    damage(tmp_path / "s", key)
    store = pb.ReceiptStore(tmp_path / "s")

    with pytest.raises(pb.ReceiptError) as info:
        store.get(lookup, q="a")
    message = str(info.value)
    assert f"receipt {key} of tool 'lookup' in {store.path} cannot be read" in message and problem in message
    assert "makes the call again" in message and f"cache clear --store {store.path} --tool lookup" in message
    caplog.clear()
    out = _frame().play.map(lookup, store=store, progress=False, refresh="rows")
    assert out["play_status"].tolist() == ["ok"] * 3 and out["lookup"].tolist() == [q * size for q in "abc"]
    assert calls == ["a", "b", "c", "a"]  # only the unreadable call was paid again
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and key in warned[0] and problem in warned[0] and str(store.path) in warned[0]
    assert store.receipts()["output"].tolist() == [q * size for q in "bca"]  # the new receipt replaced the bad one
    receipt = store.get(lookup, q="a")
    assert receipt is not None and receipt.output == "a" * size
    assert not hasattr(builtins, "_playbook_unpickled")
    store.close()


def test_unreadable_receipt_is_left_out_of_listings_once_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """receipts() and stats() list the readable receipts and warn once about an unreadable one."""
    _paid(pb.ReceiptStore(tmp_path / "s"), [], 10)
    DAMAGE["inline JSON truncated"][1](tmp_path / "s", _key("b"))
    store = pb.ReceiptStore(tmp_path / "s")
    assert store.receipts()["input"].tolist() == [{"q": "a"}, {"q": "c"}]
    assert store.stats()["by_tool"] == {"lookup": 2}
    warned = [r.getMessage() for r in caplog.records if r.name == "playbook.receipts"]
    assert len(warned) == 1 and _key("b") in warned[0]
    store.close()


def _memoised(store: pb.ReceiptStore) -> tuple[list[str], pb.Play]:
    """A play over ``_frame()`` that looks each row up once, already run: its memos are on disk."""
    calls: list[str] = []
    lookup = _counting_tool(calls)

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    store.flush()
    return calls, find


def test_unreadable_row_memo_replays_the_row_for_free(store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged row memo makes its row run again against its receipts (no call paid), with a warning."""
    calls, find = _memoised(store)
    _sql(store.path / "cache.db", "UPDATE playbook_memo SET value = '{\"v\":' WHERE key = (SELECT MIN(key) FROM playbook_memo)")
    caplog.clear()
    out = _frame().play.map(find, store=store, progress=False)
    assert sorted(out["play_status"]) == ["ok", "reused", "reused"] and out["v"].tolist() == ["value"] * 3
    assert calls == ["a", "b", "c"]
    assert any("row memo(s)" in r.getMessage() and "cannot be read" in r.getMessage() for r in caplog.records)


def test_a_reused_row_counts_the_calls_and_cost_its_memo_saved(store: pb.ReceiptStore) -> None:
    """A rerun answered from row memos reports every call of those rows as reused and their cost as saved."""

    @pb.tool(cost=0.5)
    async def priced(n: int) -> int:
        return n + 1

    @pb.play
    async def twice(row, ctx):
        first = await ctx.tool(priced, n=row.n)
        return {"v": await ctx.tool(priced, n=first + 100)}

    frame = pd.DataFrame({"n": [1, 2, 2, 3]})  # a duplicate key: its row runs (and saves) once
    first = frame.play.run(twice, store=store, progress=False).stats
    again = frame.play.run(twice, store=store, progress=False).stats
    assert (first.calls_executed, first.cost_spent, first.calls_reused) == (6, 3.0, 0)
    assert (again.reused, again.calls_executed, again.calls_reused, again.cost_saved, again.cost_spent) == (4, 0, 6, 3.0, 0.0)


def test_memos_written_without_counts_still_reuse_their_rows(store: pb.ReceiptStore) -> None:
    """A memo holding only the output (the first memo format) still settles its row as reused, saving 0 counted calls."""
    calls, find = _memoised(store)
    _sql(store.path / "cache.db", "UPDATE playbook_memo SET value = json_extract(value, '$[0]')")
    out = _frame().play.map(find, store=store, progress=False)
    assert out["play_status"].tolist() == ["reused"] * 3 and out["v"].tolist() == ["value"] * 3
    assert calls == ["a", "b", "c"] and pb.last_run().stats.calls_reused == 0


def test_failed_receipt_write_fails_the_row_instead_of_hanging(store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A receipt that cannot be written (disk full) fails its row with ReceiptError; the run does not wait forever."""
    import diskcache

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(diskcache.Disk, "_write", full)  # values of 32 kB and more are written to files
    big = _counting_tool([], result="x" * 40_000)

    async def run() -> pd.DataFrame:
        return await asyncio.wait_for(_frame().play.amap(big, store=store, progress=False), timeout=20)

    out = asyncio.run(run())
    assert out["play_status"].tolist() == ["failed"] * 3
    assert out["play_error"].iloc[0].startswith(f"ReceiptError: cannot write to the receipt store at {store.path}")
    assert "No space left on device" in out["play_error"].iloc[0]


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
