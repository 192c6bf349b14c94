"""A store that fails while a run goes on: a moment's refusal is waited for; past the store's
grace, the rows it affects fail saying why and where and those that would pay park, map() still
returns every row, paid calls whose receipts could not be written are written later (or counted
and said out loud), and odd text never crashes anything.

"Disk full" is SQLite's own answer (SQLITE_FULL) when the database may not grow any more
(``PRAGMA max_page_count``): the same error a full disk gives, without filling one."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from exact import same
from vtime import run_virtual

import playbook as pb
from playbook.store import engine
from playbook.tools import engine_of

BIG = 4000  # characters per answer: every receipt needs new pages


def _full(store: pb.ReceiptStore) -> None:
    """No room left: the database may not grow past the pages it has."""
    con = engine(store).backend.connection()
    (pages,) = con.execute("PRAGMA page_count").fetchone()
    con.execute(f"PRAGMA max_page_count = {pages}")


def _room(store: pb.ReceiptStore) -> None:
    engine(store).backend.connection().execute("PRAGMA max_page_count = 1073741823")


def _tool(
    calls: list[int], store: pb.ReceiptStore, *, full_at: int | None = None, room_at: int | None = None
) -> pb.Tool:
    @pb.tool(name="fetch", version="1")
    async def fetch(n: int) -> str:
        calls.append(n)
        if n == full_at:
            _full(store)
        if n == room_at:
            _room(store)
        await asyncio.sleep(0)
        return str(n) * BIG

    return fetch


def test_a_disk_that_stays_full_parks_the_rows_that_would_pay_and_says_what_was_lost(
    store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills up mid-run and stays full past the store's grace: the receipt of the call
    paid then fails its row naming the reason and the store, the rows that would pay after it park
    with reason "store" instead of paying for answers nobody can record, and the one paid call not
    recorded is counted and said.  Once there is room, run.retry() pays for the parked rows only."""
    calls: list[int] = []
    fetch = _tool(calls, store, full_at=5)
    frame = pd.DataFrame({"n": range(12)})
    run = run_virtual(frame.play.arun(fetch, store=store, progress=False, concurrency=1))
    statuses = run.result["play_status"].tolist()
    assert statuses == ["ok"] * 5 + ["failed"] + ["parked"] * 6
    error = run.result["play_error"].iloc[5]
    assert error.startswith(
        f"ReceiptError: cannot write to the receipt store at {store.location}: the disk is full (ENOSPC)"
    )
    assert "(for 5s); this call was paid for" in error
    assert (
        len(calls) == 6 and run.stats.receipts_lost == 1 and run.stats.parked == 6
    )  # nothing paid after the grace
    parked = run.parked
    assert set(parked["reason"]) == {"store"} and parked["message"].str.contains("refuses writes").all()
    assert any("1 paid calls could not be recorded" in n for n in run.notices)
    assert any(
        "1 paid calls could not be recorded" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )

    # Against receipts (their memos could not be written either), and this process still holds the answer not recorded.
    here = frame.play.run(fetch, store=store, progress=False)
    assert here.result["play_status"].tolist() == ["ok"] * 6 + ["parked"] * 6 and len(calls) == 6
    assert here.stats.receipts_lost == 1  # and still cannot write it

    _room(store)
    here.retry()
    assert here.result["play_status"].tolist() == ["ok"] * 12 and engine(store).unwritten() == 0
    assert sorted(calls) == list(range(12))  # each call paid once
    elsewhere = frame.play.run(
        fetch, store=pb.ReceiptStore(Path(store.location)), progress=False
    )  # as from another process
    assert elsewhere.stats.calls_local == 0 and elsewhere.result["play_status"].isin(["ok", "reused"]).all()


def test_a_disk_full_for_a_moment_fails_no_row_and_pays_each_call_once(store: pb.ReceiptStore) -> None:
    """The disk is full for 0.23 s (less than the store's grace) while 8 rows at a time pay: the
    receipts refused meanwhile are written again, the calls about to be paid for wait for the
    store, and every row is ok with each call paid once; nothing is lost."""
    calls: list[int] = []
    sent_t: list[float] = []
    full_t: list[float] = []

    @pb.tool(name="fetch", version="1")
    async def fetch(n: int) -> str:
        loop = asyncio.get_running_loop()
        calls.append(n)
        sent_t.append(loop.time())
        if n == 20:
            _full(store)
            full_t.append(loop.time())
            loop.call_later(0.23, _room, store)
        await asyncio.sleep(
            0.01
        )  # the first receipt refused is the one of a call sent now: none is sent after it
        return str(n) * BIG

    frame = pd.DataFrame({"n": range(200)})
    run = run_virtual(frame.play.arun(fetch, store=store, progress=False, concurrency=8))
    assert run.result["play_status"].tolist() == ["ok"] * 200
    assert sorted(calls) == list(range(200)) and run.stats.receipts_lost == 0
    (full,) = full_t
    assert not [
        t for t in sent_t if full + 0.01 < t < full + 0.23
    ]  # while the disk was full, nothing was paid
    assert max(sent_t) > full + 0.23  # and the rows went on once it had room
    again = frame.play.run(fetch, store=pb.ReceiptStore(Path(store.location)), progress=False)
    assert again.stats.calls_local == 0


def test_disk_full_when_memos_are_written_still_returns_the_rows(
    store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Row memos that cannot be written at the end: a warning, not an exception; the rows are ok, and
    the rerun runs them again against their receipts, paying nothing."""
    calls: list[int] = []
    fetch = _tool(calls, store)

    @pb.play
    async def play(row, ctx):
        value = await ctx.tool(fetch, n=row.n)
        if row.n == 9:
            _full(store)  # after every receipt: only the memos (written at the end) meet a full disk
        return {"v": value}

    frame = pd.DataFrame({"n": range(10)})
    out = frame.play.map(play, store=store, progress=False, concurrency=1)
    assert out["play_status"].tolist() == ["ok"] * 10
    assert any("row memos could not be written" in r.getMessage() for r in caplog.records)
    _room(store)
    again = frame.play.run(play, store=store, progress=False)
    assert (again.stats.ok, again.stats.calls_local, again.stats.calls_reused) == (10, 0, 10)


def test_a_store_removed_mid_run_is_detected_and_nothing_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's directory is deleted while a run goes on: playbook notices, makes it again, copies
    into it what the file it still had open held, and says so; a rerun of an edited play pays nothing."""
    store = pb.ReceiptStore(tmp_path / "s")
    calls: list[int] = []

    @pb.tool(name="fetch", version="1")
    async def fetch(n: int) -> int:
        calls.append(n)
        if n == 4:
            shutil.rmtree(Path(store.location))
        return n

    frame = pd.DataFrame({"n": range(10)})
    run = frame.play.run(fetch, store=store, progress=False, concurrency=1)
    assert run.result["play_status"].tolist() == ["ok"] * 10 and run.stats.receipts_lost == 0
    assert any(
        "was removed or replaced while in use" in n and "copied into it the 4 receipts" in n
        for n in run.notices
    )
    assert any(
        "nothing paid for is lost" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )
    store.close()
    assert (tmp_path / "s" / "receipts.db").is_file()

    @pb.play
    async def edited(row, ctx):  # another play: its rows run, and every call is a receipt
        return {"v": await ctx.tool(fetch, n=row.n), "edited": True}

    again = frame.play.run(edited, store=pb.ReceiptStore(tmp_path / "s"), progress=False)
    assert (again.stats.calls_local, again.stats.calls_reused) == (0, 10) and len(calls) == 10


def test_lone_surrogates_in_inputs_and_answers_are_stored_and_replayed(store: pb.ReceiptStore) -> None:
    """Text with a lone surrogate (a file decoded with errors="surrogateescape") in a cell or an answer
    runs, is memoised and comes back exactly: it fails nothing, and certainly not the whole map."""
    odd = "caf\udce9"

    @pb.tool(version="1")
    def shout(text: str) -> dict:
        return {"loud": text.upper() + "\udcff", "raw": text}

    @pb.play
    async def play(row, ctx):
        return {"s": await ctx.tool(shout, text=row.name), "echo": row.name}

    frame = pd.DataFrame(
        {"name": pd.Series([odd, "plain", odd + "!"], dtype=object)}
    )  # pyarrow strings refuse surrogates
    first = frame.play.map(play, store=store, progress=False)
    assert first["play_status"].tolist() == ["ok"] * 3
    again = frame.play.map(play, store=store, progress=False)
    assert again["play_status"].tolist() == ["reused"] * 3
    for col in ("s", "echo"):
        assert all(same(a, b) for a, b in zip(again[col], first[col]))
    assert first["s"].iloc[0] == {"loud": "CAF\udce9\udcff", "raw": odd}
    assert store.receipts()["output"].tolist()[0]["raw"] in (odd, "plain", odd + "!")


def test_bad_utf8_in_the_store_is_skipped_by_the_command_line(store: pb.ReceiptStore) -> None:
    """cache stats, list and export skip an undecodable record and say how many, instead of crashing."""
    import warm

    @pb.tool(version="1")
    def upper(q: str) -> str:
        return q.upper()

    pd.DataFrame({"q": ["a", "b", "c"]}).play.map(upper, store=store, progress=False)
    store.close()
    with sqlite3.connect(Path(store.location) / "receipts.db") as con:
        con.execute(
            "UPDATE receipt SET output = CAST(X'22ff22' AS TEXT), tool = CAST(X'75ff' AS TEXT) WHERE key = ?",
            (engine_of(upper).address({"q": "b"}),),
        )
    for command in (["stats"], ["list"], ["export"]):
        # Started warm (tests/warm.py): a process of its own, without importing pandas anew.
        done = warm.run("--store", store.location, "cache", *command, module="playbook", timeout=60)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        if command != ["stats"]:
            assert (
                "1 damaged receipts" in done.stderr
                and done.stdout.count('"A"') + done.stdout.count('"C"') == 2
            )


def test_a_store_opened_read_only_is_read_and_never_written(store: pb.ReceiptStore) -> None:
    """readonly=True (what `cache stats/list/export` use) reads receipts and stats without writing a
    byte, so it works where writes cannot (a full disk, a read-only mount); a write is refused."""

    @pb.tool(version="1")
    def upper(q: str) -> str:
        return q.upper()

    pd.DataFrame({"q": ["a", "b"]}).play.map(upper, store=store, progress=False)
    store.close()
    before = (Path(store.location) / "receipts.db").read_bytes()
    looking = pb.ReceiptStore(Path(store.location), readonly=True)
    assert looking.stats()["by_tool"] == {"upper": 2} and looking.receipts()["output"].tolist() == ["A", "B"]
    assert looking.get(upper, q="a").output == "A"
    with pytest.raises(pb.ReceiptError, match="read-only"):
        looking.clear()
    looking.close()
    assert (Path(store.location) / "receipts.db").read_bytes() == before  # the database is as it was
    wal = Path(store.location) / "receipts.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # and nothing is waiting to be written to it
    with pytest.raises(pb.ReceiptError, match="there is no receipt store at .*nothing-here to read"):
        pb.ReceiptStore(Path(store.location).parent / "nothing-here", readonly=True)


def test_rows_past_the_grace_park_without_waiting_out_a_slow_probe_of_a_store_that_stays_down() -> None:
    """A store whose every write takes 20 s to fail (a Redis Cluster with a master and its replica
    gone: its client retries for a failover's length) parks the rows that would pay within a
    second past the grace, not a probe's length each: the run ends in seconds."""
    from playbook._internal.flow import Parked
    from playbook.store.health import PROBE_WAIT_S, WriteHealth

    async def slow_refusal() -> bool:
        await asyncio.sleep(20.0)
        return False

    async def run() -> list[float]:
        health = WriteHealth(slow_refusal, grace_s=5.0)
        health.failed("Redis Cluster lost a master")
        loop = asyncio.get_running_loop()
        parked_at: list[float] = []

        async def row(start: float) -> None:
            await asyncio.sleep(start)
            try:
                await health.writable("redis://cluster")
            except Parked:
                parked_at.append(loop.time())

        await asyncio.gather(*(row(start) for start in (0.0, 6.0, 6.5, 30.0)))
        await asyncio.sleep(25.0)  # the last probe ends, for the rows after
        return parked_at

    parked_at = run_virtual(run())
    # each row parks once the grace is over, waiting for a probe under way at most PROBE_WAIT_S
    assert len(parked_at) == 4 and max(parked_at) <= 30.0 + PROBE_WAIT_S + 1e-6, parked_at
    assert sorted(parked_at)[:3] == pytest.approx([6.0, 7.0, 7.5], abs=1.01), parked_at
