"""ReceiptStore: hits, misses, None results, TTL, JSON-only storage, inspection, clearing, format,
damaged records, and stores written by playbook 0.1."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest

import playbook as pb
from playbook.store import FORMAT, MISSING, engine
from playbook.tools import engine_of

LEGACY = Path(__file__).parent / "data" / "store_v1"


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


def _sql(db: Path, statement: str, *args: object) -> list[tuple]:
    with closing(sqlite3.connect(db)) as con, con:
        return con.execute(statement, args).fetchall()


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
    assert (stats.calls_local, stats.calls_reused) == (0, 3)
    receipt = store.get(lookup, q="a")
    assert receipt is not None and receipt.output == "value" and receipt.miss is False
    assert receipt.version == engine_of(lookup).identity and receipt.version.startswith("src:")


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
    assert engine(store).lookup("r-not-a-key") is MISSING


def test_lookups_answer_named_records(tmp_path: Path) -> None:
    """A receipt lookup answers a Hit naming the value, miss, error and time; a memo lookup a Memo
    naming the row's output, calls, cost, local calls and tools."""
    clock = Clock()
    store = pb.ReceiptStore(tmp_path / "s", clock=clock)
    lookup = _counting_tool([], result={"when": pd.Timestamp("2024-01-01")})

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    core = engine(store)
    core.flush()
    tool = engine_of(lookup)
    key = tool.address(tool.bind("a", {}))
    found = core.lookup(key)
    assert found is not MISSING
    assert (found.value, found.miss, found.error, found.at) == (
        {"when": pd.Timestamp("2024-01-01")},
        False,
        None,
        clock.now,
    )
    core.fold()
    memo_keys = [key for (key,) in _sql(tmp_path / "s" / "receipts.db", "SELECT key FROM memo")]
    memos = core.memos(memo_keys)
    assert [memo.output for memo in memos.values()] == [{"v": {"when": pd.Timestamp("2024-01-01")}}] * 3
    assert {(memo.calls, memo.cost, memo.local, tuple(memo.tools)) for memo in memos.values()} == {
        (1, 0.0, 1, ("lookup",))
    }


def test_a_store_in_memory_is_one_store_in_every_thread() -> None:
    """A run in another thread on a store in memory reuses the receipts and memos a run here made."""
    store = pb.ReceiptStore("memory")
    calls: list[str] = []
    lookup = _counting_tool(calls)

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    with ThreadPoolExecutor(1) as pool:
        again = pool.submit(lambda: _frame().play.map(find, store=store, progress=False)).result()
    assert calls == ["a", "b", "c"] and again["play_status"].tolist() == ["reused"] * 3
    assert engine(store).for_thread() is engine(store)


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


def test_store_holds_only_json_text(store: pb.ReceiptStore) -> None:
    """Every record in the SQLite file is JSON text; values JSON lacks are tagged, never pickled."""
    lookup = _counting_tool(
        [], result={"nested": [1, 2.5, None, "x"], "when": pd.Timestamp("2024-01-01"), "t": (1, 2)}
    )

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    engine(store).flush()
    db = Path(store.location) / "receipts.db"
    rows = _sql(db, "SELECT input, output FROM receipt") + _sql(db, "SELECT output, output FROM memo")
    assert len(rows) == 6
    for row in rows:
        for value in row:
            assert isinstance(value, str) and isinstance(json.loads(value), dict)
    assert '{"$tuple":[1,2]}' in rows[0][1] and '"$timestamp"' in rows[0][1]


def test_newer_format_is_a_clear_error(tmp_path: Path) -> None:
    """A store written by a newer format version raises ReceiptError naming the path, both versions and what to do."""
    pb.ReceiptStore(tmp_path / "s").close()
    _sql(tmp_path / "s" / "receipts.db", "UPDATE meta SET value = '99' WHERE key = 'format'")
    with pytest.raises(pb.ReceiptError) as info:
        pb.ReceiptStore(tmp_path / "s")
    message = str(info.value)
    assert str(tmp_path / "s") in message and "newer playbook" in message
    assert "format 99" in message and f"reads format {FORMAT}" in message
    assert "Upgrade playbook" in message and "another/directory" in message
    assert _sql(tmp_path / "s" / "receipts.db", "SELECT value FROM meta WHERE key = 'format'") == [
        ("99",)
    ]  # left untouched


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda db: db.write_bytes(b"SQLite format 2\x00" + bytes(range(256)) * 16),
            "is not a readable SQLite database",
        ),
        (lambda db: db.write_bytes(db.read_bytes()[:2000]), "is not a readable SQLite database"),
        (lambda db: _sql(db, "UPDATE meta SET value = 'one' WHERE key = 'format'"), "format marker is 'one'"),
    ],
    ids=["garbage bytes", "truncated database", "unknown format marker"],
)
def test_damaged_store_is_a_clear_error(tmp_path: Path, damage, problem: str) -> None:
    """A store whose database is not SQLite or whose format marker is damaged raises ReceiptError saying what to do."""
    _paid(pb.ReceiptStore(tmp_path / "s"), [], 10)
    damage(tmp_path / "s" / "receipts.db")
    with pytest.raises(pb.ReceiptError) as info:
        pb.ReceiptStore(tmp_path / "s")
    message = str(info.value)
    assert message.startswith(f"cannot open the receipt store at {tmp_path / 's'}: ")
    assert problem in message and "Move it aside" in message and "another/directory" in message
    assert (
        info.value.__cause__ is None and info.value.__suppress_context__
    )  # one paragraph, no chained traceback


def _paid(store: pb.ReceiptStore, calls: list[str], size: int) -> pb.Tool:
    """Pay for lookup(q) over a, b and c; each result is ``size`` characters."""

    @pb.tool(name="lookup", version="1")
    def lookup(q: str) -> str:
        calls.append(q)
        return q * size

    out = _frame().play.map(lookup, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok"] * 3
    store.close()
    return lookup


def _damage(store: Path, key: str, value: object, flags: int = 0) -> None:
    """Overwrite one record's stored output (as a disk error or another program might)."""
    _sql(
        store / "receipts.db",
        "UPDATE receipt SET output = CAST(? AS TEXT), flags = ? WHERE key = ?",
        value,
        flags,
        key,
    )


DAMAGE = {
    # name: (stored bytes, flags, what the warning says)
    "JSON truncated": (b'"aaaaa', 0, "not valid JSON"),
    "not UTF-8": (b'"\xff\xfe"', 0, "not UTF-8"),
    "a tag from a newer playbook": (b'{"$quaternion":[1,2,3,4]}', 1, "unknown tag '$quaternion'"),
    "a broken tag": (b'{"$tuple":3}', 1, "not a record playbook wrote"),
    "a pickle": (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.", 0, "not UTF-8"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_unreadable_receipt_is_paid_again_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """An unreadable receipt: get() raises a clear ReceiptError; a run re-pays only that call, warns once, and heals the store."""
    stored, flags, problem = DAMAGE[case]
    calls: list[str] = []
    lookup = _paid(pb.ReceiptStore(tmp_path / "s"), calls, 10)
    key = engine_of(lookup).address({"q": "a"})
    _damage(tmp_path / "s", key, stored, flags)
    store = pb.ReceiptStore(tmp_path / "s")

    with pytest.raises(pb.ReceiptError) as info:
        store.get(lookup, q="a")
    message = str(info.value)
    assert (
        f"receipt {key} of tool 'lookup' in {store.location} cannot be read" in message and problem in message
    )
    assert (
        "makes the call again" in message and f"cache clear --store {store.location} --tool lookup" in message
    )
    caplog.clear()
    out = _frame().play.map(lookup, store=store, progress=False, refresh="rows")
    assert out["play_status"].tolist() == ["ok"] * 3 and out["lookup"].tolist() == [q * 10 for q in "abc"]
    assert calls == ["a", "b", "c", "a"]  # only the unreadable call was paid again
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and key in warned[0] and problem in warned[0] and store.location in warned[0]
    receipt = store.get(lookup, q="a")
    assert receipt is not None and receipt.output == "a" * 10  # the new receipt replaced the bad one
    store.close()


def test_unreadable_receipts_are_left_out_of_listings(tmp_path: Path) -> None:
    """receipts() lists the readable receipts; stats() counts every record, whatever its bytes."""
    lookup = _paid(pb.ReceiptStore(tmp_path / "s"), [], 10)
    _damage(tmp_path / "s", engine_of(lookup).address({"q": "b"}), b"\xff")
    store = pb.ReceiptStore(tmp_path / "s")
    assert store.receipts()["input"].tolist() == [{"q": "a"}, {"q": "c"}]
    assert store.stats()["by_tool"] == {"lookup": 3}
    store.close()


def _memoised(store: pb.ReceiptStore) -> tuple[list[str], pb.Play]:
    """A play over ``_frame()`` that looks each row up once, already run: its memos are on disk."""
    calls: list[str] = []
    lookup = _counting_tool(calls)

    @pb.play
    async def find(row, ctx):
        return {"v": await ctx.tool(lookup, q=row.q)}

    _frame().play.map(find, store=store, progress=False)
    engine(store).flush()
    return calls, find


@pytest.mark.parametrize(
    ("column", "bad"),
    [("output", b'{"v":'), ("output", b'{"v":"\xff"}'), ("output", b"[1,2,3]"), ("tools", b" lookup ")],
    ids=["truncated", "not UTF-8", "another shape", "tools garbled"],
)
def test_unreadable_row_memo_replays_the_row_for_free(
    store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture, column: str, bad: bytes
) -> None:
    """A damaged row memo makes its row run again against its receipts (no call paid), with a warning."""
    calls, find = _memoised(store)
    _sql(
        Path(store.location) / "receipts.db",
        f"UPDATE memo SET {column} = CAST(? AS TEXT) WHERE key = (SELECT MIN(key) FROM memo)",
        bad,
    )
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
    assert (again.reused, again.calls_executed, again.calls_reused, again.cost_saved, again.cost_spent) == (
        4,
        0,
        6,
        3.0,
        0.0,
    )


def test_unopenable_store_is_a_clear_error(tmp_path: Path) -> None:
    """A store path that is a file raises ReceiptError naming the path."""
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    with pytest.raises(pb.ReceiptError, match="not-a-dir"):
        pb.ReceiptStore(target)


def test_receipts_stats_and_clear(store: pb.ReceiptStore) -> None:
    """receipts() lists inputs and outputs per tool; clear(tool) removes that tool's receipts and the memos
    of rows that used it, so the next run pays for that tool, and only it, again."""
    one_calls: list[str] = []
    one = _counting_tool(one_calls, result="1")
    other_calls: list[str] = []

    @pb.tool(name="other", cost=0.5)
    def other(q: str) -> str:
        other_calls.append(q)
        return q.upper()

    @pb.play
    async def both(row, ctx):
        return {"a": await ctx.tool(one, q=row.q), "b": await ctx.tool(other, q=row.q)}

    @pb.play
    async def only_one(row, ctx):
        return {"a": await ctx.tool(one, q=row.q)}

    _frame().play.map(both, store=store, progress=False)
    _frame().play.map(only_one, store=store, progress=False)
    frame = store.receipts("other")
    assert sorted(frame["output"]) == ["A", "B", "C"]
    assert frame["input"].tolist()[0] in ({"q": "a"}, {"q": "b"}, {"q": "c"})
    stats = store.stats()
    assert stats["by_tool"] == {"lookup": 3, "other": 3}
    assert stats["row_memos"] == 6 and stats["cost_stored"] == 1.5
    assert engine(store).memo_count("other") == 3 and store.clear("other") == 3
    assert (
        store.stats()["by_tool"] == {"lookup": 3} and store.stats()["row_memos"] == 3
    )  # only_one's memos stay

    again = _frame().play.run(both, store=store, progress=False)
    assert (again.stats.ok, again.stats.calls_executed, again.stats.calls_reused) == (3, 3, 3)
    assert sorted(other_calls) == ["a", "a", "b", "b", "c", "c"] and one_calls == ["a", "b", "c"]
    assert _frame().play.run(only_one, store=store, progress=False).stats.reused == 3
    store.clear()
    assert store.stats()["receipts"] == 0 and store.stats()["row_memos"] == 0


def test_receipt_is_committed_before_the_row_continues(store: pb.ReceiptStore) -> None:
    """When ctx.tool returns, its receipt is already visible to another connection."""
    lookup = _counting_tool([])
    seen: list[bool] = []

    @pb.play
    async def check(row, ctx):
        await ctx.tool(lookup, q=row.q)
        key = engine_of(lookup).address({"q": row.q})
        seen.append(
            _sql(Path(store.location) / "receipts.db", "SELECT COUNT(*) FROM receipt WHERE key = ?", key)
            == [(1,)]
        )

    pd.DataFrame({"q": [f"k{i}" for i in range(40)]}).play.map(
        check, store=store, progress=False, concurrency=20
    )
    assert seen == [True] * 40


# -- stores written by playbook 0.1 (format 1, diskcache) --------------------------------------


def _legacy(tmp_path: Path) -> Path:
    """A copy of tests/data/store_v1: two rows of play 'legacy', written by playbook 0.1."""
    path = tmp_path / "old"
    shutil.copytree(LEGACY, path)
    return path


def test_a_store_of_playbook_0_1_opens_and_keeps_its_pinned_receipts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An old store opens without error: its receipts are copied (cache.db untouched), listed, and those
    of tools pinned with version= still answer; unpinned tools and steps' rows run again, as the README says."""
    path = _legacy(tmp_path)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    store = pb.ReceiptStore(path)
    assert any(
        "copied 8 receipts and step records of an earlier playbook" in r.getMessage() for r in caplog.records
    )
    assert {name: (path / name).read_bytes() for name in before} == before  # the old files are only read
    assert store.stats()["by_tool"] == {"big": 2, "pinned": 2, "unpinned": 2}
    listed = store.receipts("big")
    assert sorted(len(o) for o in listed["output"]) == [
        32800,
        41000,
    ]  # the values kept in files came across too

    calls: list[str] = []

    @pb.tool(name="pinned", version="2")
    def pinned(q: str) -> dict:
        calls.append(f"pinned:{q}")
        return {"q": q, "n": len(q), "tags": ["a", "b"]}

    @pb.tool(name="unpinned")
    def unpinned(q: str) -> str:
        calls.append(f"unpinned:{q}")
        return q.upper()

    @pb.play
    async def legacy(row, ctx):
        first = await ctx.step("once", lambda: calls.append("step") or {"stepped": True})
        return {
            "p": await ctx.tool(pinned, q=row.q),
            "u": await ctx.tool(unpinned, q=row.q),
            "s": first["stepped"],
        }

    out = pd.DataFrame({"q": ["alpha", "beta"]}).play.map(legacy, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "ok"]
    assert out["p"].tolist() == [
        {"q": "alpha", "n": 5, "tags": ["a", "b"]},
        {"q": "beta", "n": 4, "tags": ["a", "b"]},
    ]
    assert sorted(calls) == [
        "unpinned:alpha",
        "unpinned:beta",
    ]  # the pinned calls and the steps answered from the old store
    store.close()
    reopened = pb.ReceiptStore(path)
    assert reopened.stats()["receipts"] == 8 and reopened.stats()["row_memos"] == 2  # copied once, not again
    reopened.close()


def test_an_emptied_old_index_with_value_files_left_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """cache.db emptied from outside, its value files left behind: the lost receipts are reported, not silently ignored."""
    path = _legacy(tmp_path)
    (path / "cache.db").write_bytes(b"")
    store = pb.ReceiptStore(path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "2 value files of an earlier playbook store" in w and "emptied or replaced from outside" in w
        for w in warned
    )
    assert store.stats()["receipts"] == 0 and any("value files" in n for n in engine(store).notices)
    store.close()


def test_an_unreadable_old_store_is_refused_not_overwritten(tmp_path: Path) -> None:
    """cache.db that is not a database: the store is refused with what to do, and nothing is created beside it."""
    path = _legacy(tmp_path)
    (path / "cache.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(pb.ReceiptError, match="holds a store of an earlier playbook .* cannot be read"):
        pb.ReceiptStore(path)
    assert not (path / "receipts.db").exists() or _sql(path / "receipts.db", "SELECT COUNT(*) FROM meta") == [
        (0,)
    ]


def test_receipts_frame_keeps_values_and_gives_datetimes(tmp_path: Path) -> None:
    """receipts(): an int output stays an int next to a miss's None (not a float beside NaN), ``miss``
    is boolean, ``created_at`` a UTC datetime of when the call was paid; an empty store has the same dtypes."""

    @pb.tool(name="lookup")
    def lookup(n: int) -> int | None:
        return None if n % 2 else 2**60 + n  # past 2**53: a float would change it

    store = pb.ReceiptStore(tmp_path / "store")
    empty = store.receipts()
    before = pd.Timestamp.now(tz="UTC")
    pd.DataFrame({"n": range(4)}).play.map(lookup, store=store, progress=False)
    frame = store.receipts()
    assert frame["output"].tolist() == [2**60, None, 2**60 + 2, None]
    assert [type(v) for v in frame["output"]] == [int, type(None), int, type(None)]
    assert frame["miss"].tolist() == [False, True, False, True]
    assert frame["miss"].dtype == bool and frame["cost"].dtype == float
    assert str(frame["created_at"].dtype) == "datetime64[us, UTC]"
    assert (frame["created_at"] >= before.floor("us")).all() and (
        frame["created_at"] <= pd.Timestamp.now(tz="UTC")
    ).all()
    assert (
        list(empty.columns) == list(frame.columns)
        and empty.dtypes.astype(str).tolist() == frame.dtypes.astype(str).tolist()
    )
    store.close()
