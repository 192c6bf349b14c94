"""A store that lost its receipts between runs (emptied, made again, a Redis server wiped) is
noticed when it is opened, before anything is paid; ``store.accept_loss()`` accepts what it holds."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import redis

import playbook as pb
from playbook._internal.redis_nodes import sync_client
from playbook.ui.tally import Tally
from playbook.ui.text import summary

ROWS = 20
paid: list[int] = []


@pb.tool(name="lookup", version="1")
async def lookup(n: int) -> int:
    paid.append(n)
    return n * 3


@pb.play(name="tripled")
async def tripled(row, ctx):  # type: ignore[no-untyped-def]
    return {"v": await ctx.tool(lookup, n=row.n)}


FRAME = pd.DataFrame({"n": range(ROWS)})


def _run(where: str | Path) -> pb.Run:
    """A run in a store opened for it and closed after (as a script's process does)."""
    paid.clear()
    store = pb.ReceiptStore(where)
    try:
        return FRAME.play.run(tripled, store=store, progress=False)
    finally:
        store.close()


def _refused(where: str | Path) -> str:
    paid.clear()
    store = pb.ReceiptStore(where)
    with pytest.raises(pb.ReceiptError) as refused:
        FRAME.play.run(tripled, store=store, progress=False)
    store.close()
    assert paid == []  # nothing was paid
    return str(refused.value)


def test_a_store_file_emptied_between_runs_is_noticed_before_anything_is_paid(tmp_path: Path) -> None:
    where = tmp_path / "store"
    assert _run(where).stats.calls_local == ROWS
    for name in ("receipts.db-wal", "receipts.db-shm"):
        (where / name).unlink(missing_ok=True)
    os.truncate(where / "receipts.db", 0)  # emptied in place
    message = _refused(where)
    assert f"held {ROWS} receipts at " in message and "now holds 0" in message, message
    assert (
        "made again from nothing, or swapped" in message
        and f"pb.ReceiptStore({str(where)!r}).accept_loss()" in message
    )
    assert _refused(where) == message  # still lost: a refusal is not an acceptance
    pb.ReceiptStore(where).accept_loss()
    again = _run(where)
    assert again.stats.calls_local == ROWS and again.result["v"].tolist() == [n * 3 for n in range(ROWS)]
    assert _run(where).stats.calls_local == 0  # and from there, a rerun is free again


def test_a_store_directory_made_again_empty_is_noticed(tmp_path: Path) -> None:
    """The mark beside the data goes with the directory: the user's own marks remember it."""
    where = tmp_path / "store"
    _run(where)
    shutil.rmtree(where)
    where.mkdir()
    assert f"held {ROWS} receipts" in _refused(where)


def _wipe(url: str) -> None:
    """Empty the server, or every master of a cluster: as a server back without its data."""
    client = sync_client(url)
    if isinstance(client, redis.RedisCluster):
        for node in client.get_primaries():
            client.get_redis_connection(node).flushdb()
    else:
        client.flushdb()
    client.close()


def test_a_redis_store_wiped_between_runs_is_noticed(any_redis_url: str) -> None:
    """A server (or every master of a cluster) back without its data: refused before paying."""
    redis_url = any_redis_url
    assert _run(redis_url).stats.calls_local == ROWS
    _wipe(redis_url)
    message = _refused(redis_url)
    assert f"held {ROWS} receipts" in message and "now holds 0" in message and "accept_loss()" in message
    store = pb.ReceiptStore(redis_url)
    store.accept_loss()
    assert _run(redis_url).stats.calls_local == ROWS


def test_a_redis_server_brought_back_from_an_older_copy_is_noticed(redis_url: str) -> None:
    """A server restored from an older snapshot of its data (or a replica that lagged): fewer
    receipts than its mark, the same store: noticed before anything is paid."""
    store = pb.ReceiptStore(redis_url)
    FRAME.head(ROWS - 5).play.run(tripled, store=store, progress=False)
    store.close()
    client = redis.Redis.from_url(redis_url)
    snapshot = {name: client.dump(name) for name in client.scan_iter(match="playbook:*")}
    _run(redis_url)
    client.flushdb()
    for name, value in snapshot.items():
        client.restore(name, 0, value)
    message = _refused(redis_url)
    assert (
        f"held {ROWS} receipts" in message
        and f"now holds {ROWS - 5}" in message
        and "not by playbook" in message
    )


def test_clearing_a_tool_is_not_a_loss(tmp_path: Path) -> None:
    where = tmp_path / "store"
    _run(where)
    assert pb.ReceiptStore(where).clear("lookup") == ROWS
    assert _run(where).stats.calls_local == ROWS  # paid again, as asked: no refusal


def test_a_store_cleared_from_another_machine_is_not_taken_for_lost(
    redis_url: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The mark beside the data (newer) wins over this machine's own (older)."""
    monkeypatch.setenv("PLAYBOOK_MARKS", str(tmp_path / "here"))
    _run(redis_url)
    monkeypatch.setenv("PLAYBOOK_MARKS", str(tmp_path / "elsewhere"))
    pb.ReceiptStore(redis_url).clear()
    monkeypatch.setenv("PLAYBOOK_MARKS", str(tmp_path / "here"))
    assert pb.ReceiptStore(redis_url).lost is None
    assert _run(redis_url).stats.calls_local == ROWS


def test_a_lost_store_can_still_be_looked_at(tmp_path: Path) -> None:
    """Reading is not paying: a lost store opens read-only, and its stats answer."""
    where = tmp_path / "store"
    _run(where)
    shutil.rmtree(where)
    where.mkdir()
    store = pb.ReceiptStore(where)
    assert store.lost is not None and store.stats()["receipts"] == 0


def _deleting_at(where: Path, row: int) -> pb.Play:
    """``tripled``, but row ``row`` first deletes every receipt from receipts.db, as another
    program would (the run's own connection stays open and writes on)."""

    @pb.play(name="tripled")
    async def deleting(row, ctx):  # type: ignore[no-untyped-def]
        if row.n == row_at:
            with sqlite3.connect(where / "receipts.db") as con:
                con.execute("DELETE FROM receipt")
            con.close()
        return {"v": await ctx.tool(lookup, n=row.n)}

    row_at = row
    return deleting


def test_receipts_deleted_from_a_store_file_while_a_run_goes_on_are_said_and_refused_next(
    tmp_path: Path,
) -> None:
    """The same loss as a Redis server restarted without its data, on SQLite: the run says it,
    the store's mark keeps the higher count, and the next run refuses before paying."""
    where = tmp_path / "store"
    paid.clear()
    store = pb.ReceiptStore(where)
    run = FRAME.play.run(_deleting_at(where, 10), store=store, progress=False, concurrency=2)
    assert run.stats.ok == ROWS
    said = [note for note in run.notices if "lost receipts while this run went on" in note]
    assert len(said) == 1 and f"should hold at least {ROWS} " in said[0] and "holds 10:" in said[0], (
        run.notices
    )
    assert (
        "warning: " + said[0] in summary(run.state, Tally.of(run.state)).splitlines()
    )  # a script's text summary
    paid.clear()
    with pytest.raises(pb.ReceiptError, match=f"held {ROWS} receipts"):
        FRAME.play.run(tripled, store=store, progress=False)
    store.close()
    message = _refused(where)
    assert (
        f"held {ROWS} receipts" in message
        and "now holds 10" in message
        and "cache accept-loss --store" in message
    )


def test_a_store_cleared_elsewhere_while_open_here_is_not_taken_for_lost(tmp_path: Path) -> None:
    """A clearing lowers the count on purpose: a store kept open here (with what it expects of
    its receipts) runs on after another ReceiptStore, or another process, cleared it."""
    where = tmp_path / "store"
    paid.clear()
    kept = pb.ReceiptStore(where)
    assert FRAME.play.run(tripled, store=kept, progress=False).stats.calls_local == ROWS
    elsewhere = pb.ReceiptStore(where)
    assert elsewhere.clear("lookup") == ROWS
    elsewhere.close()
    again = FRAME.play.run(tripled, store=kept, progress=False)
    assert again.stats.calls_local == ROWS and not [n for n in again.notices if "lost" in n], again.notices
    assert kept.lost is None and _run(where).stats.calls_local == 0
    kept.close()


@pytest.mark.parametrize("how", ["clear", "accept_loss"])
def test_a_store_cleared_elsewhere_then_run_by_a_third_is_not_taken_for_lost_here(
    how: str, any_redis_url: str
) -> None:
    """A store kept open here; another kernel empties it on purpose (a clearing, or a flush and an
    acceptance of the loss) and a third runs on it, marking what it holds after: the mark it writes carries the
    clearing on, so this kernel's next run is not refused for the receipts cleared away."""
    redis_url = any_redis_url
    paid.clear()
    kept = pb.ReceiptStore(redis_url)
    assert FRAME.play.run(tripled, store=kept, progress=False).stats.calls_local == ROWS
    elsewhere = pb.ReceiptStore(redis_url)
    if how == "clear":
        assert elsewhere.clear("lookup") == ROWS
    else:
        _wipe(redis_url)
        elsewhere.accept_loss()
    elsewhere.close()
    third = pd.DataFrame({"n": range(100, 105)}).play.run(
        tripled, store=redis_url, progress=False
    )  # writes a plain mark, later
    assert third.stats.calls_local == 5
    again = FRAME.play.run(tripled, store=kept, progress=False)
    assert again.stats.calls_local == ROWS and not [n for n in again.notices if "lost" in n], again.notices
    assert kept.lost is None
    kept.close()
