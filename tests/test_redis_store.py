"""The receipt store on a real Redis server, as a user meets it: ``store="redis://..."``,
``$PLAYBOOK_HOME`` as a URL, a rerun that reads receipts a chunk of rows at a time, clearing a
tool, and the words said when the server would lose receipts or cannot be reached."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import pandas as pd
import pytest
import redis

import playbook as pb
from playbook.addresses import row_id
from playbook.demo.redis_server import RedisServer
from playbook.store import MISSING, engine

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


def test_a_map_with_a_any_redis_url_pays_once_and_a_rerun_reuses_every_row(any_redis_url: str) -> None:
    """store="redis://..." keeps receipts and row memos there: the rerun pays nothing and returns the same frame."""
    frame = pd.DataFrame({"n": range(50)})
    first = frame.play.run(_play("1"), store=any_redis_url, progress=False)
    again = frame.play.run(_play("1"), store=any_redis_url, progress=False)

    assert first.stats.calls_executed == 100 and first.stats.ok == 50
    assert again.stats.calls_executed == 0 and again.stats.reused == 50
    pd.testing.assert_frame_equal(
        first.result.drop(columns="play_status"), again.result.drop(columns="play_status")
    )


def test_a_run_that_finished_is_in_the_server_when_it_returns(redis_url: str) -> None:
    """The last row's memo and receipts are on the server once run() returns, even when the
    server is slow to take writes: a second store object (another kernel) reuses every row."""
    admin = redis.Redis.from_url(redis_url)
    lookup = _lookup_tool()
    rows = 20

    async def enrich(row, ctx):  # type: ignore[no-untyped-def]
        found = await ctx.tool(lookup, n=row.n)
        if row.n == rows - 1:  # the server takes no writes for a while: this row's memo waits
            admin.execute_command("CLIENT", "PAUSE", 400, "WRITE")
        return {"label": found["label"]}

    frame = pd.DataFrame({"n": range(rows)})
    first = frame.play.run(
        pb.play(enrich, name="slow", version="1"), store=redis_url, progress=False, concurrency=1
    )
    again = frame.play.run(pb.play(enrich, name="slow", version="1"), store=redis_url, progress=False)

    assert first.stats.ok == rows
    assert again.stats.reused == rows and again.stats.calls_executed == 0


def test_playbook_home_may_be_a_any_redis_url(any_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With $PLAYBOOK_HOME=redis://..., the default store is that server."""
    monkeypatch.setenv("PLAYBOOK_HOME", any_redis_url)
    frame = pd.DataFrame({"n": range(5)})
    frame.play.run(_play("1"), progress=False)

    assert pb.ReceiptStore(any_redis_url).stats()["receipts"] == 10
    assert pb.ReceiptStore().location == any_redis_url


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


def test_a_row_cancelled_while_receipts_are_read_ahead_does_not_cancel_the_read(any_redis_url: str) -> None:
    """Rows waiting for the same chunk of receipts read ahead share one read: one of them stopped
    meanwhile (Ctrl-C, a stop) leaves the others their answers."""
    store = pb.ReceiptStore(any_redis_url)
    pd.DataFrame({"n": range(20)}).play.run(_play("1"), store=store, progress=False)
    core = engine(store)
    keys = [key for key, _ in core.records()]

    async def main() -> object:
        core.warm("enrich", lambda: [row_id([n]) for n in range(20)])  # the rows are about to run again
        first = asyncio.ensure_future(core.alookup(keys[0]))
        second = asyncio.ensure_future(core.alookup(keys[1]))
        await asyncio.sleep(0)  # both wait for the chunk being read
        first.cancel()
        return await second

    found = asyncio.run(main())
    assert found is not MISSING and found[0]["label"].startswith("item-")  # type: ignore[index]


def test_clearing_a_tool_on_redis_makes_the_next_run_pay_for_it_again(any_redis_url: str) -> None:
    """clear(tool) on a Redis store drops its receipts and the memos of rows that used it."""
    frame = pd.DataFrame({"n": range(20)})
    store = pb.ReceiptStore(any_redis_url)
    frame.play.run(_play("1"), store=store, progress=False)
    assert store.clear("lookup") == 40
    again = frame.play.run(_play("1"), store=store, progress=False)

    assert again.stats.reused == 0 and again.stats.calls_executed == 40


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


def test_a_rediss_url_at_a_plain_redis_asks_whether_it_speaks_tls(redis_url: str) -> None:
    """store= rediss:// at a Redis without TLS: the ReceiptError says to use redis:// for a plain one."""
    with pytest.raises(pb.ReceiptError, match=r"does the server speak TLS\? use redis:// for a plain one"):
        pd.DataFrame({"n": [1]}).play.map(
            _play("1"), store=redis_url.replace("redis://", "rediss://"), progress=False
        )


def test_clearing_everything_keeps_the_shared_limits_of_providers(redis_url: str) -> None:
    """clear() on a Redis store that a shared limiter also uses drops receipts and memos, never the
    limiter's state (its rate, holds and the permits of calls in flight)."""
    provider = pb.Provider("acme", rps=50, concurrency=4, shared=redis_url)

    @pb.tool(name="acme.lookup", provider=provider, cost=0.001)
    async def lookup(n: int) -> int:
        return n

    frame = pd.DataFrame({"n": range(10)})
    frame.play.run(lookup, store=redis_url, progress=False)
    admin = redis.Redis.from_url(redis_url)
    admin.set("playbook:limit:{acme:default}:hold", "marker")  # stands for a hold in force

    def state() -> set[bytes]:  # the lasting keys (per-tenth-second counters expire on their own)
        return {
            name
            for name in admin.scan_iter("playbook:limit:*")
            if b":sent:" not in name and b":refused:" not in name
        }

    before = state()
    assert len(before) >= 2, f"the shared limiter kept no state in Redis: {before}"
    assert pb.ReceiptStore(redis_url).clear() > 0
    assert state() == before
    assert admin.get("playbook:limit:{acme:default}:hold") == b"marker"


@pytest.mark.parametrize(
    "where", ["redis:/localhost", "REDIS:/localhost:6379", "http://localhost:6379/0", "rediss:localhost"]
)
def test_a_mistyped_redis_url_is_an_error_not_a_directory(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that looks like a URL but is not a usable one is refused, naming it; no directory of that name is made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pb.ReceiptError, match="neither a directory nor a Redis URL"):
        pd.DataFrame({"n": [1]}).play.map(_play("1"), store=where, progress=False)
    monkeypatch.setenv("PLAYBOOK_HOME", where)
    with pytest.raises(pb.ReceiptError, match="neither a directory nor a Redis URL"):
        pd.DataFrame({"n": [1]}).play.map(_play("1"), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_upper_case_scheme_and_a_path_with_a_colon_are_understood(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REDIS://… is the same server; ./a:b (or a Path) is a directory with a colon in its name."""
    store = pb.ReceiptStore(redis_url.replace("redis://", "REDIS://"))
    assert store.stats()["receipts"] == 0
    monkeypatch.chdir(tmp_path)
    assert (
        Path(pb.ReceiptStore("./a:b").location) == Path("a:b")
        and (tmp_path / "a:b" / "receipts.db").is_file()
    )
    assert pb.ReceiptStore(tmp_path / "c:d").location == str(tmp_path / "c:d")


def test_an_unknown_option_in_a_redis_url_is_a_clear_error(redis_url: str) -> None:
    """A query option redis-py does not know is a ReceiptError naming the URL, not a TypeError."""
    with pytest.raises(pb.ReceiptError, match="not a Redis URL playbook can use"):
        pb.ReceiptStore(redis_url + "?foo=bar")


@pytest.mark.slow
def test_a_redis_that_stops_answering_never_freezes_the_run() -> None:
    """A Redis server frozen mid-run (SIGSTOP: a paused VM, a dead network) leaves the event loop
    free: other tasks keep running, and run.stop() ends the run within its grace, not after the
    server's timeouts.  In real time: a socket left unanswered and a loop left turning are what it
    measures, with bounds far from what a loaded machine's stalls reach."""
    with RedisServer() as server:
        store = pb.ReceiptStore(server.url)
        lookup = _lookup_tool()

        async def slow(row, ctx):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.01)
            return {"v": await ctx.tool(lookup, n=row.n)}

        async def main() -> tuple[float, float, int]:
            loop = asyncio.get_running_loop()
            run = await pd.DataFrame({"n": range(5000)}).play.arun(
                pb.play(slow, name="slow"), store=store, background=True, progress=False
            )
            deadline = loop.time() + 30
            while (
                run.stats.ok < 10
            ):  # the run is under way (on a loaded machine, after more than a fixed pause)
                assert loop.time() < deadline, "no row finished"
                await asyncio.sleep(0.01)
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                gaps, last = [], loop.time()
                for _ in range(40):  # 2 s of a ticker: the loop must keep turning
                    await asyncio.sleep(0.05)
                    gaps.append(loop.time() - last)
                    last = loop.time()
                stopped = loop.time()
                run.stop()
                await asyncio.wait_for(_finished(run), 30)
                # What the frozen server was given last is not confirmed, and the run says so.
                assert any("did not confirm this run's last writes" in note for note in run.notices), (
                    run.notices
                )
                return max(gaps), loop.time() - stopped, run.stats.ok
            finally:
                os.kill(server.process.pid, signal.SIGCONT)

        worst_gap, to_stop, ok = asyncio.run(main())
        store.close()
    # A call waiting on the frozen server in the loop's thread would stand it still for the socket's
    # timeout (10 s); a loaded machine's stalls are a fraction of that.
    assert worst_gap < 3.0, f"the event loop stood still for {worst_gap:.2f}s while Redis did not answer"
    assert to_stop < 12, f"the run took {to_stop:.1f}s to stop"
    assert 0 < ok < 5000


async def _finished(run: pb.Run) -> None:
    while run.state.running:
        await asyncio.sleep(0.05)


@pytest.mark.slow
def test_a_full_redis_parks_the_rows_that_would_pay_instead_of_paying_for_what_it_cannot_record(
    redis_url: str,
) -> None:
    """A real Redis at its maxmemory with noeviction refuses every write (OOM): once it has
    refused past the store's grace, the rows that would pay park with reason "store"; of what
    was paid, at most the calls in flight when it filled go unrecorded (a write it takes now and
    then, as leases expire and free a little memory, records what was kept)."""
    server = redis.Redis.from_url(redis_url)
    before = server.config_get("maxmemory")["maxmemory"]
    server.config_set("maxmemory-policy", "noeviction")
    server.config_set("maxmemory", int(server.info("memory")["used_memory"]) + 2_000_000)
    calls: list[int] = []

    @pb.tool(name="big", version="1")
    async def big(n: int) -> str:
        calls.append(n)
        await asyncio.sleep(0.001)
        return f"{n:08d}" * 5_000  # 40 kB: the server is full after about 50

    try:
        store = pb.ReceiptStore(redis_url, write_grace=0.5)
        run = pd.DataFrame({"n": range(400)}).play.run(big, store=store, progress=False, concurrency=4)
        statuses = run.result["play_status"].value_counts().to_dict()
        assert 20 < statuses["ok"] < 100 and statuses.get("parked", 0) > 250, statuses
        assert (
            set(run.parked["reason"]) == {"store"}
            and run.parked["message"].str.contains("out of memory").all()
        )
        # Paid and not ok: a receipt still unwritten at the end (lost), or one a later probe wrote
        # when the server freed a little memory (its row had failed by then; a rerun reuses it).
        not_recorded = len(calls) - statuses["ok"]
        assert run.stats.receipts_lost <= min(not_recorded, 4), (
            len(calls),
            statuses,
            run.stats,
        )  # at most the calls in flight
        store.close()
    finally:
        server.config_set("maxmemory", before)


def test_a_redis_store_that_fails_says_to_bring_it_back_not_to_use_another() -> None:
    """A Redis store that stops answering, or does not answer when opened, says to start the
    server again and rerun: never to pass another store, which would pay for every call again."""
    with RedisServer() as server:
        store = engine(pb.ReceiptStore(server.url))
        server.crash()
        with pytest.raises(pb.ReceiptError) as failed:
            store.lookup("r" + "0" * 32)
        store.close()
        with pytest.raises(pb.ReceiptError) as opening:
            pb.ReceiptStore(server.url)
    for error in (failed, opening):
        message = str(error.value)
        assert "another/directory" not in message and "another store" not in message
        assert "start the Redis server" in message and "run again" in message


def test_an_unknown_option_in_a_store_url_is_named(any_redis_url: str) -> None:
    """A store URL whose query names an option no connection takes (``?prefix=``) is refused at
    opening, naming it, in playbook's words; one it takes (``socket_timeout``) opens."""
    with pytest.raises(pb.ReceiptError) as refused:
        pb.ReceiptStore(any_redis_url + "?prefix=x")
    message = str(refused.value)
    assert "'prefix'" in message and "not an option" in message and "unexpected keyword" not in message
    assert "always under 'playbook:'" in message
    pb.ReceiptStore(any_redis_url + "?socket_timeout=3").close()


def test_a_cluster_store_url_naming_another_database_is_refused_in_playbooks_words(cluster_url: str) -> None:
    """A cluster's URL naming database 3 says a Redis Cluster has one database, not redis-py's
    "SELECT is not allowed in cluster mode"."""
    with pytest.raises(pb.ReceiptError) as refused:
        pb.ReceiptStore(cluster_url.rsplit("/", 1)[0] + "/3")
    message = str(refused.value)
    assert "a Redis Cluster has one database, 0" in message and "'3'" in message
    assert "SELECT" not in message
