"""The receipt store on a real Redis server, as a user meets it: ``store="redis://..."``,
``$PLAYBOOK_HOME`` as a URL, a rerun that reads receipts a chunk of rows at a time, clearing a
tool, and the words said when the server would lose receipts or cannot be reached."""

from __future__ import annotations

import socket
from pathlib import Path

import pandas as pd
import pytest
import redis

import playbook as pb

ROWS = 1000


def _mgets(url: str) -> int:
    """How many MGET commands the server has answered (its own count)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


def _lookup_tool() -> pb.Tool:
    @pb.tool(name="lookup", version="1", cost=0.001)  # a cost: a paid call, counted as executed
    async def lookup(n: int) -> dict[str, object]:
        return {"n": n, "label": f"item-{n}"}

    return lookup


def _play(version: str) -> pb.Play:
    lookup = _lookup_tool()

    async def enrich(row, ctx):  # type: ignore[no-untyped-def]
        first = await ctx.tool(lookup, n=row.n)
        second = await ctx.tool(lookup, n=row.n + ROWS)
        return {"label": first["label"], "other": second["label"]}

    return pb.play(enrich, name="enrich", version=version)


def test_a_map_with_a_redis_url_pays_once_and_a_rerun_reuses_every_row(redis_url: str) -> None:
    """store="redis://..." keeps receipts and row memos there: the rerun pays nothing and returns the same frame."""
    frame = pd.DataFrame({"n": range(50)})
    first = frame.play.run(_play("1"), store=redis_url, progress=False)
    again = frame.play.run(_play("1"), store=redis_url, progress=False)

    assert first.stats.calls_executed == 100 and first.stats.ok == 50
    assert again.stats.calls_executed == 0 and again.stats.reused == 50
    pd.testing.assert_frame_equal(first.result.drop(columns="play_status"), again.result.drop(columns="play_status"))


def test_playbook_home_may_be_a_redis_url(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With $PLAYBOOK_HOME=redis://..., the default store is that server."""
    monkeypatch.setenv("PLAYBOOK_HOME", redis_url)
    frame = pd.DataFrame({"n": range(5)})
    frame.play.run(_play("1"), progress=False)

    assert pb.ReceiptStore(redis_url).stats()["receipts"] == 10
    assert pb.ReceiptStore().location == redis_url


def test_a_rerun_of_an_edited_play_reads_receipts_a_chunk_of_rows_per_round_trip(redis_url: str) -> None:
    """An edited play's rerun on Redis reuses every receipt with a few MGETs in all, not one round trip per call."""
    frame = pd.DataFrame({"n": range(ROWS)})
    store = pb.ReceiptStore(redis_url)
    frame.play.run(_play("1"), store=store, progress=False, concurrency=16)
    before = _mgets(redis_url)
    rerun = frame.play.run(_play("2"), store=store, progress=False, concurrency=16)
    trips = _mgets(redis_url) - before

    assert rerun.stats.calls_reused == 2 * ROWS and rerun.stats.calls_executed == 0
    assert rerun.result["label"].tolist() == [f"item-{n}" for n in range(ROWS)]
    # Memos (2 chunks of 512 rows), the hints of those rows, and their receipts 512 rows at a
    # time: about 6.  One lookup per event-loop turn would be 2000 / 16 = 125.
    assert trips <= 12, f"{trips} MGETs for {2 * ROWS} receipts"


def test_clearing_a_tool_on_redis_makes_the_next_run_pay_for_it_again(redis_url: str) -> None:
    """clear(tool) on a Redis store drops its receipts and the memos of rows that used it."""
    frame = pd.DataFrame({"n": range(20)})
    store = pb.ReceiptStore(redis_url)
    frame.play.run(_play("1"), store=store, progress=False)
    assert store.clear("lookup") == 40
    again = frame.play.run(_play("1"), store=store, progress=False)

    assert again.stats.reused == 0 and again.stats.calls_executed == 40


def test_a_server_that_would_lose_receipts_is_said_in_the_run(redis_url: str) -> None:
    """A Redis server with no persistence is named in the run's notices, with the fix."""
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("appendonly", "no")
    try:
        run = pd.DataFrame({"n": [1]}).play.run(_play("1"), store=pb.ReceiptStore(redis_url), progress=False)
    finally:
        admin.config_set("appendonly", "yes")
    assert any("keeps receipts in memory only" in note and "--appendonly yes" in note for note in run.notices)


def test_a_redis_url_nothing_answers_is_a_clear_error(tmp_path: Path) -> None:
    """store= a Redis URL where nothing listens raises ReceiptError naming the URL, before any call is paid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"redis://:hunter2@127.0.0.1:{s.getsockname()[1]}/0"
        with pytest.raises(pb.ReceiptError) as failed:
            pd.DataFrame({"n": [1]}).play.map(_play("1"), store=url, progress=False)
    message = str(failed.value)
    assert f"127.0.0.1:{url.rsplit(':', 1)[1]}" in message and "Connection refused" in message
    assert "hunter2" not in message
