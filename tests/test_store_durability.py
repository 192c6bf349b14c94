"""What the store promises about durability, on the real components: SQLite receipts reach the
disk (fsync) before their rows go on; a Redis server's persistence is read, not assumed (stock
RDB-only servers are said loudly, evicting servers refused unless accepted, and what they evict
is counted)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import redis

import playbook as pb
from playbook.demo.redis_server import RedisServer
from playbook.events import RunNotice
from playbook.store import engine


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the runs here are processes of their own, which reach a
    provider only through a socket."""
    return demo_loopback


STOCK = ("--appendonly", "no", "--save", "3600 1 300 100 60 10000")  # redis.conf as Debian ships it
EVICTING = ("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")


@pb.tool(name="lookup", version="1")
async def lookup(n: int) -> dict:
    await asyncio.sleep(0.002)
    return {"n": n, "text": "x" * 2000}  # 2 MB of receipts by row 1,000 or so


@pb.play(name="durable")
async def durable(row, ctx):  # type: ignore[no-untyped-def]
    return {"found": (await ctx.tool(lookup, n=row.n))["n"]}


@pytest.fixture(scope="module")
def stock_redis() -> Iterator[RedisServer]:
    with RedisServer(*STOCK) as server:
        yield server


@pytest.fixture(scope="module")
def evicting_redis() -> Iterator[RedisServer]:
    with RedisServer(*EVICTING) as server:
        yield server


def _said(notes: list[str], words: str) -> list[str]:
    return [note for note in notes if words in note]


@pytest.mark.redis
def test_a_stock_redis_server_is_said_loudly_by_every_run_with_the_fix(
    stock_redis: RedisServer, caplog
) -> None:  # type: ignore[no-untyped-def]
    """RDB snapshots only (Debian's redis.conf): a warning at opening, logged, and in each run's
    notices and text summary, naming the server and the one line that fixes it."""
    stock_redis.flush()
    with caplog.at_level(logging.WARNING, logger="playbook.store"):
        store = pb.ReceiptStore(stock_redis.url)
    logged = _said([r.getMessage() for r in caplog.records], "does not keep receipts durably")
    assert logged and stock_redis.url.split("//")[1] in logged[0]
    frame = pd.DataFrame({"n": range(3)})
    for _ in range(2):  # a second run on the same store says it again: it is still true
        run = frame.play.run(durable, store=store, progress=False)
        said = _said(run.notices, "does not keep receipts durably")
        assert len(said) == 1, run.notices
        assert "appendonly no" in said[0] and "save '3600 1 300 100 60 10000'" in said[0]
        assert "CONFIG SET appendonly yes" in said[0] and "durability='best-effort'" in said[0]
    store.close()


@pytest.mark.redis
@pytest.mark.slow
def test_the_text_summary_of_a_run_on_a_stock_server_carries_the_warning(
    stock_redis: RedisServer, tmp_path: Path
) -> None:
    """A script's run (text on stderr) prints the warning with the rest of its summary."""
    stock_redis.flush()
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import pandas as pd, playbook as pb
        @pb.tool(name="lookup", version="1")
        async def lookup(n: int) -> int:
            return n
        @pb.play(name="job")
        async def job(row, ctx):
            return {{"v": await ctx.tool(lookup, n=row.n)}}
        pd.DataFrame({{"n": range(3)}}).play.map(job, store={stock_redis.url!r})
        """)
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"warning: the Redis server at \S+ does not keep receipts durably", done.stderr), (
        done.stderr
    )


def test_a_server_with_an_append_only_file_is_not_warned_about(redis_url: str) -> None:
    """appendonly yes, appendfsync everysec (what the README asks for): nothing to say."""
    run = pd.DataFrame({"n": range(3)}).play.run(durable, store=pb.ReceiptStore(redis_url), progress=False)
    assert not _said(run.notices, "Redis server"), run.notices


@pytest.mark.redis
def test_best_effort_accepts_a_stock_server_quietly(stock_redis: RedisServer) -> None:
    """durability='best-effort' (the keyword, or ?durability= in the URL) is the user's acknowledgement."""
    stock_redis.flush()
    for store in (
        pb.ReceiptStore(stock_redis.url, durability="best-effort"),
        pb.ReceiptStore(stock_redis.url + "?durability=best-effort"),
    ):
        run = pd.DataFrame({"n": range(3)}).play.run(durable, store=store, progress=False)
        assert run.stats.ok + run.stats.reused == 3 and not _said(run.notices, "durabl"), run.notices
        store.close()


def test_an_append_only_file_synced_only_by_the_os_is_said(redis_url: str) -> None:
    """appendfsync no: a machine crash loses tens of seconds of receipts; the fix is named."""
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("appendfsync", "no")
    try:
        run = pd.DataFrame({"n": [1]}).play.run(durable, store=pb.ReceiptStore(redis_url), progress=False)
    finally:
        admin.config_set("appendfsync", "everysec")
    assert _said(run.notices, "CONFIG SET appendfsync everysec"), run.notices


@pytest.mark.redis
def test_an_evicting_server_is_refused_before_anything_is_paid(
    evicting_redis: RedisServer, demo: pb.demo.DemoServer
) -> None:
    """maxmemory-policy allkeys-lru: opening the store fails naming the policy and both ways out;
    nothing reaches the provider."""
    evicting_redis.flush()
    with pytest.raises(pb.ReceiptError) as refused:
        pb.ReceiptStore(evicting_redis.url)
    message = str(refused.value)
    assert "maxmemory-policy allkeys-lru" in message and "CONFIG SET maxmemory-policy noeviction" in message
    assert "durability='best-effort'" in message and evicting_redis.url.split("//")[1] in message
    email = pb.http_tool(
        "demo.email",
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer demo-key"},
        pick="email",
        miss_status=(404,),
    )

    @pb.play(name="pays")
    async def pays(row, ctx):  # type: ignore[no-untyped-def]
        return {"email": await ctx.tool(email, domain=row.domain, first="Ada")}

    with pytest.raises(pb.ReceiptError, match="maxmemory-policy allkeys-lru"):
        pd.DataFrame({"domain": ["a.com", "b.com"]}).play.map(pays, store=evicting_redis.url, progress=False)
    assert demo.stats()["requests"] == 0


@pytest.mark.redis
@pytest.mark.slow
def test_an_accepted_evicting_server_counts_what_it_evicts_during_the_run(
    evicting_redis: RedisServer,
) -> None:
    """With durability='best-effort', 3,000 rows on 2 MB: the keys evicted are counted in the
    run's notices while it goes (before its last rows finish), and at its end."""
    evicting_redis.flush()
    admin = redis.Redis.from_url(evicting_redis.url)
    before = int(admin.info("stats")["evicted_keys"])
    store = pb.ReceiptStore(evicting_redis.url, durability="best-effort")
    assert _said(engine(store).standing, "maxmemory-policy allkeys-lru")
    heard: list[tuple[int, int]] = []  # (rows finished when said, keys evicted)

    async def main() -> pb.Run:
        frame = pd.DataFrame(
            {"n": range(3000)}
        )  # 8 at a time: a few seconds, the server full within the first
        run = await frame.play.arun(durable, store=store, progress=False, background=True, concurrency=8)

        def on_notice(event: RunNotice) -> None:
            if m := re.search(r"has evicted ([\d,]+) keys", event.message):
                heard.append((run.state.done, int(m.group(1).replace(",", ""))))

        run.state.subscribe(on_notice, kinds=(RunNotice,))
        await run
        return run

    run = asyncio.run(main())
    evicted = int(admin.info("stats")["evicted_keys"]) - before
    assert evicted > 0 and run.stats.ok == 3000
    assert heard and heard[0][0] < 3000, heard  # said while rows were still running
    counts = [count for _, count in heard]
    # The last is said as the run's writes end; a server over its memory evicts a little more at
    # any command after that (a lease let go, this test's INFO).
    assert counts == sorted(counts) and evicted - 100 <= counts[-1] <= evicted, (heard, evicted)
    assert [f"{count:,}" in note for count, note in zip(counts, _said(run.notices, "has evicted"))] == [
        True
    ] * len(counts)
    store.close()


def test_a_bad_durability_is_a_clear_error(redis_url: str, tmp_path: Path) -> None:
    for where in (redis_url, str(tmp_path / "store")):
        with pytest.raises(pb.ReceiptError, match=r"durability='fast' is not one of 'strict', 'best-effort'"):
            pb.ReceiptStore(where, durability="fast")
    with pytest.raises(pb.ReceiptError, match=r"durability='fast'"):
        pb.ReceiptStore(redis_url + "?durability=fast")


@pytest.mark.redis
def test_the_address_other_processes_open_keeps_the_durability(evicting_redis: RedisServer) -> None:
    """A cluster's workers open the store by its address: the user's acceptance goes with it."""
    store = pb.ReceiptStore(evicting_redis.url, durability="best-effort")
    again = pb.ReceiptStore(engine(store).address)  # as a worker opens it
    assert _said(engine(again).standing, "accepted (durability='best-effort')")
    again.close()
    store.close()


# -- SQLite: a receipt is on the disk before its row goes on ---------------------------------

_TRACED = r"""
import os, sys
import pandas as pd, playbook as pb
marks = int(sys.argv[2])

@pb.tool(name="lookup", version="1")
async def lookup(n: int) -> int:
    os.write(marks, b"C%d;" % n)  # answered: its receipt is written after this
    return n

@pb.play(name="traced")
async def traced(row, ctx):
    v = await ctx.tool(lookup, n=row.n)
    os.write(marks, b"R%d;" % row.n)  # the row goes on: its receipt must be on the disk by now
    return {"v": v}

store = pb.ReceiptStore(sys.argv[1], durability=sys.argv[3])
pd.DataFrame({"n": range(40)}).play.map(traced, store=store, progress=False, concurrency=8)
"""


def _trace(tmp_path: Path, durability: str) -> list[str]:
    """Run 40 rows under strace; return, in order, 'W' for each write to the store's log (the
    WAL), 'S' for each sync of it, 'C<n>' for row n's call answered and 'R<n>' for row n going
    on past its receipt."""
    script = tmp_path / "traced.py"
    script.write_text(_TRACED)
    log = tmp_path / "trace.log"
    marks = os.open(os.devnull, os.O_WRONLY)
    try:
        done = subprocess.run(
            [
                "strace",
                "-f",
                "-y",
                "-o",
                str(log),
                "-e",
                "trace=write,pwrite64,fsync,fdatasync",
                sys.executable,
                str(script),
                str(tmp_path / "store"),
                str(marks),
                durability,
            ],
            pass_fds=(marks,),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(marks)
    assert done.returncode == 0, done.stderr[-3000:]
    events = []
    mark = re.compile(rf'write\({marks}</dev/null>, "([CR]\d+);"')
    for line in log.read_text().splitlines():
        if "receipts.db-wal>" in line and ("pwrite64(" in line or "write(" in line):
            events.append("W")
        elif "receipts.db-wal>" in line and ("fsync(" in line or "fdatasync(" in line):
            events.append("S")
        elif found := mark.search(line):
            events.append(found[1])
    return events


def _unsynced(events: list[str]) -> int:
    """Rows that went on before their receipt was synced: between the row's call being answered
    and the row going on, the log was not written and then synced.  (Other rows' receipts may be
    written meanwhile: a row that goes on after its own receipt's sync is not counted for them.)"""
    answered: dict[str, int] = {}
    count = 0
    for i, event in enumerate(events):
        if event[0] == "C":
            answered[event[1:]] = i
        elif event[0] == "R":
            since = events[answered[event[1:]] : i]
            count += "W" not in since or "S" not in since[since.index("W") :]
    return count


def _rows(events: list[str]) -> int:
    return sum(event[0] == "R" for event in events)


@pytest.mark.slow
def test_each_receipt_is_synced_to_the_disk_before_its_row_goes_on(tmp_path: Path) -> None:
    """durability='strict' (the default): between the last write to the log and any row going
    on, the log was synced: a power cut after a row said ok keeps that row's receipt."""
    events = _trace(tmp_path, "strict")
    assert _rows(events) == 40 and events.count("S") >= 1
    assert _unsynced(events) == 0, " ".join(events)


@pytest.mark.slow
def test_best_effort_sqlite_commits_without_syncing_each_receipt(tmp_path: Path) -> None:
    """durability='best-effort': SQLite's NORMAL (a killed process loses nothing, a machine crash
    may take the last commits): rows go on past writes the log has not synced."""
    events = _trace(tmp_path, "best-effort")
    assert _rows(events) == 40 and _unsynced(events) > 0, " ".join(events)


@pytest.mark.redis
def test_one_url_with_durability_names_the_store_and_the_shared_limits(evicting_redis: RedisServer) -> None:
    """store= and shared= may be the same URL (a cluster's is): the limits take no offence at ?durability=."""
    evicting_redis.flush()
    url = evicting_redis.url + "?durability=best-effort"
    api = pb.Provider("acme", rps=50, concurrency=2, shared=url)

    @pb.tool(name="limited", version="1", provider=api)
    async def limited(n: int) -> int:
        return n * 2

    @pb.play(name="limited")
    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(limited, n=row.n)}

    out = pd.DataFrame({"n": range(5)}).play.map(play, store=url, progress=False)
    assert out["play_status"].tolist() == ["ok"] * 5 and out["v"].tolist() == [0, 2, 4, 6, 8]


# -- a Redis server killed (kill -9) and started again from its files --------------------------


def _paid_then_crashed(server: RedisServer) -> tuple[int, pb.ReceiptStore]:
    """300 rows paid on ``server``, which is then killed with SIGKILL and started again.  Not at
    once: with appendfsync everysec, a server whose last fsync is still under way (a loaded
    disk) answers before it writes, for up to 2 s; the kill comes after that."""
    store = pb.ReceiptStore(server.url, durability="best-effort")  # a stock server is accepted, and said
    run = pd.DataFrame({"n": range(300)}).play.run(durable, store=store, progress=False)
    store.close()
    time.sleep(2.5)
    server.crash()
    server.start()
    return run.stats.ok, pb.ReceiptStore(server.url, durability="best-effort")


@pytest.mark.redis
@pytest.mark.slow
def test_a_killed_redis_server_with_an_append_only_file_loses_no_receipt(tmp_path: Path) -> None:
    """appendonly yes, appendfsync everysec: what the server answered is in its file's pages
    before the answer left, so a killed server comes back with every receipt and a rerun pays nothing."""
    with RedisServer() as server:
        ok, store = _paid_then_crashed(server)
        assert ok == 300 and store.lost is None
        again = pd.DataFrame({"n": range(300)}).play.run(durable, store=store, progress=False)
        # No call made again: every row reused, from its memo or (a memo is not a receipt, and a
        # loaded disk may delay the server's last writes) from its receipts.
        assert (
            again.stats.reused + again.stats.ok == 300
            and again.stats.calls_local == 0
            and again.stats.calls_reused + again.stats.reused >= 300
        )
        store.close()


@pytest.mark.redis
@pytest.mark.slow
def test_a_killed_stock_redis_server_loses_its_receipts_and_the_rerun_says_so_before_paying(
    tmp_path: Path,
) -> None:
    """RDB snapshots only: the server comes back without the receipts written since its last
    snapshot; the store's mark notices, and the rerun refuses before paying for them again."""
    with RedisServer(*STOCK) as server:
        ok, store = _paid_then_crashed(server)
        assert ok == 300 and store.lost is not None
        assert "held 300 receipts" in store.lost and "now holds 0" in store.lost, store.lost
        with pytest.raises(pb.ReceiptError, match="held 300 receipts"):
            pd.DataFrame({"n": range(300)}).play.run(durable, store=store, progress=False)
        store.close()


# -- a Redis server restarted while a run goes on ---------------------------------------------------

NOTHING_KEPT = ("--appendonly", "no", "--save", "")  # neither an append-only file nor snapshots


@pytest.mark.redis
@pytest.mark.parametrize("options", [NOTHING_KEPT, STOCK], ids=["no persistence", "RDB snapshots only"])
def test_a_redis_server_restarted_mid_run_without_its_receipts_is_said_and_the_next_run_refused(
    options: tuple[str, ...],
) -> None:
    """Killed and started again at row 200 of 300, a server without an append-only file comes back
    without the receipts written since its last snapshot (none, or one taken at row 100): the run
    says so, the store's mark keeps the higher count, and the next run (this store object, or one
    opened afresh) refuses before paying, until the store is reset; then it pays at most for what is gone."""
    snapshots = "--save" in options and options[options.index("--save") + 1] != ""
    sent: list[int] = []
    with RedisServer(*options) as server:

        @pb.tool(name="restarting", version="1")
        async def restarting(n: int) -> int:
            sent.append(n)
            if n == 100 and snapshots:
                redis.Redis.from_url(server.url).save()  # the snapshot the server comes back with
            if n == 200:
                server.crash()
                server.start()  # same port, same files
            return n * 7

        @pb.play(name="restarted")
        async def restarted(row, ctx):  # type: ignore[no-untyped-def]
            return {"v": await ctx.tool(restarting, n=row.n)}

        frame = pd.DataFrame({"n": range(300)})
        store = pb.ReceiptStore(server.url)
        run = frame.play.run(restarted, store=store, progress=False, concurrency=4)
        assert run.stats.ok + run.stats.failed == 300 and run.stats.receipts_lost == 0, run.notices
        held = pb.ReceiptStore(server.url, readonly=True).stats()["receipts"]
        # Those written after the restart (rows 200 on, and those in flight then), and the snapshot's.
        assert (190 < held < 250) if snapshots else (100 <= held < 150), held
        said = _said(run.notices, "lost receipts while this run went on")
        assert len(said) == 1 and "should hold at least 300 " in said[0] and f"holds {held}:" in said[0], (
            run.notices
        )
        assert "cache accept-loss --store" in said[0] and ".accept_loss()" in said[0]
        sent.clear()
        for again in (store, pb.ReceiptStore(server.url)):
            with pytest.raises(pb.ReceiptError) as refused:
                frame.play.run(restarted, store=again, progress=False)
            assert "held 300 receipts" in str(refused.value) and f"now holds {held}" in str(refused.value)
        assert sent == []  # nothing paid
        pb.ReceiptStore(server.url).accept_loss()
        rerun = frame.play.run(restarted, store=store, progress=False, concurrency=4)
        # Rows whose memo came back with the server need no receipt: at most what is gone is paid again.
        assert len(sent) <= 300 - held and rerun.result["v"].tolist() == [n * 7 for n in range(300)]
        store.close()


# -- counts that are true ----------------------------------------------------------------------


def test_receipts_refused_for_a_while_then_written_at_the_end_are_not_counted_lost(redis_url: str) -> None:
    """A Redis server that refuses writes for longer than the store's grace (here: it wants a
    replica it has not got) fails the rows whose receipts (or leases) it refused; the run writes
    those receipts once the server takes writes again, and says so, and only what the server
    still refuses at the end counts as lost: here nothing, and a rerun pays only for the calls
    never made."""
    admin = redis.Redis.from_url(redis_url)
    sent: list[int] = []

    @pb.tool(name="toggling", version="1")
    async def toggling(n: int) -> int:
        sent.append(n)
        if n == 3:  # the server refuses writes from row 3's receipt on
            admin.config_set("min-replicas-to-write", 1)
        return n * 10

    @pb.play(name="toggled")
    async def toggled(row, ctx):  # type: ignore[no-untyped-def]
        if row.n == 7:  # and takes them again from row 7
            admin.config_set("min-replicas-to-write", 0)
        return {"m": await ctx.tool(toggling, n=row.n)}

    frame = pd.DataFrame({"n": range(10)})
    store = pb.ReceiptStore(redis_url, write_grace=0.5)  # refused past it all the same, in a tenth the time
    try:
        run = frame.play.run(toggled, store=store, progress=False, concurrency=1)
        assert run.result["play_status"].tolist() == ["ok"] * 3 + ["failed"] * 4 + ["ok"] * 3
        assert sent == [0, 1, 2, 3, 7, 8, 9]  # rows 4..6 could not take their calls' leases
        assert run.stats.receipts_lost == 0, run.notices
        assert any(
            "1 receipts of paid calls that could not be written before were written" in n for n in run.notices
        ), run.notices
        again = frame.play.run(toggled, store=store, progress=False, concurrency=1)
        assert again.result["play_status"].tolist()[3:7] == ["ok"] * 4 and again.stats.calls_local == 3
        assert (
            sent == [0, 1, 2, 3, 7, 8, 9, 4, 5, 6] and again.stats.receipts_lost == 0
        )  # row 3's call not paid again
    finally:
        admin.config_set("min-replicas-to-write", 0)
        store.close()
