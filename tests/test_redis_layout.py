"""The store's keys on Redis: a store an older playbook wrote is rewritten when opened (nothing
paid for is lost), prefixes that would choose a cluster's slots are refused, and a failover of a
Redis Cluster that lost receipts is noticed before a rerun pays for them again."""

from __future__ import annotations

import itertools
import json
import string
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pandas as pd
import pytest
import redis
from redis.crc import key_slot

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer
from playbook.store.protocol import StoreFailure
from playbook.store.records import MemoRow, Record, memo_tools
from playbook.store.redis.backend import RedisBackend
from playbook.store.redis.slots import tag

OLD = 2500  # receipts in the older store: more than one chunk of its rewrite


def _old_store(url: str) -> None:
    """Write a store as playbook 0.x did on Redis: a value ``[at, miss, flags, error]`` and the
    output, a hash ``info:`` beside it, a sorted set of receipts, a set per tool, memo sets."""
    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for n in range(OLD):
        key, tool = f"r{n:032x}", ("lookup" if n % 2 else "other")
        pipe.set(
            f"playbook:{key}", json.dumps([1_700_000_000.5 + n, False, 0, None]) + "\n" + json.dumps({"n": n})
        )
        pipe.hset(
            f"playbook:info:{key}", mapping={"tool": tool, "version": "1", "account": "default", "cost": 0.25}
        )
        pipe.hset(f"playbook:info:{key}", "input", json.dumps({"n": n}))
        pipe.zadd("playbook:receipts", {key: 1_700_000_000.5 + n})
        pipe.sadd(f"playbook:tool:{tool}", key)
    step = f"s{1:032x}"
    pipe.set(f"playbook:{step}", json.dumps([1.5, False, 0, None]) + "\n" + '"slept"')
    pipe.hset(f"playbook:info:{step}", mapping={"tool": "sleep", "version": "", "account": "", "cost": 0})
    for n in range(10):
        memo, tool = f"m{n:032x}", ("lookup" if n % 2 else "other")
        pipe.set(
            f"playbook:{memo}",
            json.dumps(["play", memo_tools({tool: "f1"}), 1, 0.25, 0]) + "\n" + '{"row": 1}',
        )
        pipe.sadd("playbook:memos", memo)
        pipe.sadd(f"playbook:memos:{tool}", memo)
    pipe.execute()
    client.close()


def test_a_store_written_by_an_older_playbook_is_rewritten_when_opened_and_loses_nothing(
    redis_url: str,
) -> None:
    """Every receipt, step record and memo of the older layout reads back whole, counts, lists
    and clears by tool once the store is opened; its indexes are gone."""
    _old_store(redis_url)
    backend = RedisBackend(redis_url)
    assert backend.receipt_count() == OLD
    key = f"r{7:032x}"
    assert backend.get(key) == Record(
        key, "lookup", "1", "default", 1_700_000_007.5, 0.25, False, 0, '{"n": 7}', '{"n": 7}', None
    )
    step = backend.get(f"s{1:032x}")
    assert isinstance(step, Record) and step.tool == "sleep" and step.output == '"slept"'
    assert [key for key, _ in backend.records()][:3] == [f"r{n:032x}" for n in range(3)]  # oldest first
    assert backend.counts().by_tool["lookup"] == (OLD // 2, 0.25 * OLD / 2)
    assert backend.memo_count("lookup") == 5
    client = redis.Redis.from_url(redis_url)
    assert not client.keys("playbook:info:*") and not client.keys("playbook:tool:*")
    assert not client.exists("playbook:receipts", "playbook:memos", "playbook:memos:lookup")
    assert backend.clear("lookup") == OLD // 2
    assert backend.receipt_count() == OLD // 2 and backend.memo_count("lookup") == 0
    assert backend.memo_count("other") == 5
    backend.close()
    client.close()


def test_two_processes_opening_an_older_store_at_once_count_each_receipt_once(redis_url: str) -> None:
    """Opened by several at the same moment, the rewrite is done once (a lock, chunks that count
    what they take out of the older index): the count is what the older store held."""
    _old_store(redis_url)
    with ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(lambda _: RedisBackend(redis_url), range(4)))
    assert {backend.receipt_count() for backend in opened} == {OLD}
    for backend in opened:
        backend.close()


def test_an_older_store_replays_its_receipts_in_a_run(redis_url: str) -> None:
    """A run on a store an older playbook wrote pays nothing for what it paid then."""

    @pb.tool(name="lookup", version="1", cost=0.001)
    async def lookup(n: int) -> int:
        return n

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(lookup, n=row.n)}

    first = pd.DataFrame({"n": range(20)}).play.run(pb.play(play, name="p"), store=redis_url, progress=False)
    client = redis.Redis.from_url(redis_url)
    # Back to the older layout: what 0.x would have left of that run.
    for name in list(client.scan_iter(match="playbook:r*")):
        header, _, rest = client.get(name).partition(b"\n")
        at, miss, flags, error, tool, version, account, cost, n = json.loads(header)
        client.set(name, json.dumps([at, bool(miss), flags, error]).encode() + b"\n" + rest[:n])
        client.hset(
            b"playbook:info:" + name[9:],
            mapping={
                "tool": tool,
                "version": version,
                "account": account,
                "cost": cost,
                "input": rest[n + 1 :],
            },
        )
        client.zadd("playbook:receipts", {name[9:]: at})
    client.delete("playbook:count")
    client.close()
    again = pd.DataFrame({"n": range(20)}).play.run(
        pb.play(play, name="p", version="2"), store=redis_url, progress=False
    )
    assert first.stats.calls_executed == 20
    assert again.stats.calls_executed == 0 and again.stats.calls_reused == 20


def test_a_prefix_with_a_brace_is_refused_naming_it(redis_url: str) -> None:
    """A brace in the prefix would choose the slot of every key on a cluster: refused, named."""
    with pytest.raises(StoreFailure) as refused:
        RedisBackend(redis_url, prefix="team{a}")
    assert "'team{a}'" in refused.value.reason and "brace" in refused.value.reason


def _replica_of(master: RedisServer) -> redis.Redis:
    with redis.Redis(port=master.port) as client:
        role = client.execute_command("ROLE")
    return redis.Redis(port=int(role[2][0][1]), single_connection_client=True)


def _record(n: int) -> Record:
    return Record(f"r{n:032x}", "lookup", "1", "default", 1.5, 0.0, False, 0, None, str(n), None)


def _on(backend: RedisBackend, master: RedisServer, count: int) -> list[Record]:
    """``count`` records whose keys live on ``master``."""
    client = redis.RedisCluster(host="127.0.0.1", port=master.port)
    found = []
    n = 0
    while len(found) < count:
        record = _record(n)
        if client.get_node_from_key(f"playbook:{record.key}").port == master.port:
            found.append(record)
        n += 1
    client.close()
    return found


def test_a_write_on_a_cluster_waits_for_a_replica_so_a_killed_master_loses_nothing_acknowledged() -> None:
    """A write waits (WAIT 1) until a replica has it: with the replica stalled it waits, and a
    master killed right after a write's answer has lost none of it."""
    with RedisClusterServer() as cluster:
        backend = RedisBackend(cluster.url)
        master = cluster.masters()[0]
        records = _on(backend, master, 40)
        replica = _replica_of(master)
        replica.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        started = time.monotonic()
        assert backend.write(records[:20]) == 20
        assert time.monotonic() - started >= 0.9  # it waited for the replica
        replica.execute_command("CLIENT", "UNPAUSE")
        assert backend.write(records[20:]) == 20
        cluster.kill(master)
        cluster.wait_ok()
        again = RedisBackend(cluster.url)
        assert all(found is not None for found in again.lookup_many([record.key for record in records]))
        assert again.receipt_count() == 40
        for each in (backend, again, replica):
            each.close()


def test_a_failover_that_lost_receipts_is_noticed_before_a_rerun_pays() -> None:
    """Receipts a master took but its replica never received, lost when the replica took over:
    their counts went with them, so the store's mark says lost, and nothing is paid."""
    paid: list[int] = []

    @pb.tool(name="lookup", version="1", cost=0.001)
    async def lookup(n: int) -> int:
        paid.append(n)
        return n

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(lookup, n=row.n)}

    frame = pd.DataFrame({"n": range(60)})
    with RedisClusterServer() as cluster:
        url = cluster.url
        pd.DataFrame({"n": range(30)}).play.run(pb.play(play, name="p"), store=url, progress=False)
        master = next(node for node in cluster.masters() if f":{node.port}/" not in url)
        replica = _replica_of(master)
        replica.execute_command("CLIENT", "PAUSE", 6000, "WRITE")  # it receives nothing more
        done = frame.play.run(pb.play(play, name="p"), store=url, progress=False)
        assert done.stats.calls_executed == 30
        cluster.kill(master)
        cluster.wait_ok()
        replica.execute_command("CLIENT", "UNPAUSE")
        paid.clear()
        store = pb.ReceiptStore(url)
        assert store.lost is not None and "held 60 receipts" in store.lost
        with pytest.raises(pb.ReceiptError):
            frame.play.run(pb.play(play, name="p"), store=store, progress=False)
        assert paid == []
        store.close()
        replica.close()


def test_opening_a_cluster_says_what_a_failover_may_lose(cluster_url: str) -> None:
    """A store on a Redis Cluster says, when opened, what a failover loses and what guards it."""
    backend = RedisBackend(cluster_url)
    assert any("failover loses the receipts its replica had not received" in said for said in backend.about)
    assert any("WAIT" in said for said in backend.about)
    backend.close()


def test_a_memo_on_a_cluster_is_cleared_with_a_tool_it_used(cluster_url: str) -> None:
    """Clearing a tool on a cluster drops the memos of rows that used it, on every master."""
    backend = RedisBackend(cluster_url)
    memos = [
        MemoRow(f"m{n:032x}", "play", memo_tools({"lookup" if n % 2 else "other": "f1"}), 1, 0.0, 0, "1")
        for n in range(40)
    ]
    backend.write_memos(memos)
    assert backend.memo_count("lookup") == 20 and backend.memo_count("other") == 20
    backend.clear("lookup")
    assert backend.memo_count("lookup") == 0 and backend.memo_count("other") == 20
    backend.close()


def test_a_cluster_that_lost_a_master_for_good_is_said_in_words() -> None:
    """A master gone with no replica to take over: the write fails after the client's retries,
    saying the cluster lost a master and none took over, not a bare socket error."""
    with RedisClusterServer(replicas=0, node_timeout=500) as cluster:
        backend = RedisBackend(cluster.url)
        records = [_record(n) for n in range(30)]  # on every master
        backend.write(records)
        cluster.kill(next(node for node in cluster.masters() if f":{node.port}/" not in cluster.url))
        with pytest.raises(StoreFailure) as failed:
            backend.write(records)
        assert "lost a master and no replica took over within about 20 s" in failed.value.reason
        assert cluster.url in failed.value.reason and failed.value.code == "CLUSTERDOWN"
        backend.close()


def test_every_master_of_a_cluster_is_asked_what_it_keeps(
    redis_cluster: RedisClusterServer, cluster_url: str
) -> None:
    """One master of the cluster without an append-only file (not the one in the URL): said."""
    master = next(node for node in redis_cluster.masters() if f":{node.port}/" not in cluster_url)
    with redis.Redis(port=master.port) as client:
        client.config_set("appendonly", "no")
        try:
            backend = RedisBackend(cluster_url)
            assert any("no append-only file" in said for said in backend.standing)
            backend.close()
        finally:
            client.config_set("appendonly", "yes")


def _bytes(client: redis.Redis, pattern: str) -> int:
    return sum(int(client.memory_usage(name, samples=0) or 0) for name in client.scan_iter(match=pattern))


def test_a_receipt_takes_under_half_the_memory_the_older_layout_took(redis_url: str) -> None:
    """The same receipts, written by the store and as the older layout kept them (a value, a
    hash beside it, a sorted set and a set per tool): under half the bytes (MEMORY USAGE)."""
    records = [
        Record(
            f"r{n:032x}",
            "lookup",
            "1",
            "default",
            1_700_000_000.5 + n,
            0.001,
            False,
            0,
            f'{{"n":{n}}}',
            f'{{"n":{n}}}',
            None,
        )
        for n in range(2000)
    ]
    backend = RedisBackend(redis_url, prefix="new")
    assert backend.write(records) == len(records)
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for row in records:
        pipe.set(f"old:{row.key}", json.dumps([row.at, row.miss, row.flags, row.error]) + "\n" + row.output)
        fields = {
            "tool": row.tool,
            "version": row.version,
            "account": row.account,
            "cost": row.cost,
            "input": row.input,
        }
        pipe.hset(f"old:info:{row.key}", mapping=fields)  # type: ignore[arg-type]
        pipe.zadd("old:receipts", {row.key: row.at})
        pipe.sadd(f"old:tool:{row.tool}", row.key)
    pipe.execute()
    new, old = _bytes(client, "new:*"), _bytes(client, "old:*")
    assert new <= 0.5 * old, (
        f"{new / len(records):.0f} B a receipt, the older layout {old / len(records):.0f} B"
    )
    backend.close()
    client.close()


def test_an_older_store_opened_read_only_is_read_whole_and_counted(redis_url: str) -> None:
    """Opened read-only (nothing rewritten), a store of the older layout still lists its
    receipts whole and counts them: not taken for lost, nothing damaged."""
    _old_store(redis_url)
    backend = RedisBackend(redis_url, readonly=True)
    assert backend.receipt_count() == OLD
    key = f"r{7:032x}"
    assert backend.get(key) == Record(
        key, "lookup", "1", "default", 1_700_000_007.5, 0.25, False, 0, '{"n": 7}', '{"n": 7}', None
    )
    with redis.Redis.from_url(redis_url) as client:
        assert client.zcard("playbook:receipts") == OLD  # as it was
    backend.close()


def _no_input(url: str, count: int) -> None:
    """The first ``count`` receipts of the older store as 0.x kept a call without input: ``""``."""
    with redis.Redis.from_url(url) as client:
        for n in range(count):
            client.hset(f"playbook:info:r{n:032x}", "input", "")


def test_an_older_store_opened_read_only_counts_and_lists_every_receipt(redis_url: str) -> None:
    """``stats()`` and ``receipts()`` of an older store opened read-only count and list every
    receipt, with the values it was written with (a call without input: no input)."""
    _old_store(redis_url)
    _no_input(redis_url, 10)
    store = pb.ReceiptStore(redis_url, readonly=True)
    stats = store.stats()
    assert stats["receipts"] == OLD and stats["by_tool"] == {"lookup": OLD // 2, "other": OLD // 2}
    assert stats["cost_stored"] == 0.25 * OLD
    receipts = store.receipts()
    assert len(receipts) == OLD
    assert list(receipts["output"][:3]) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert receipts["input"][0] is None and receipts["input"][10] == {"n": 10}
    store.close()
    with redis.Redis.from_url(redis_url) as client:
        assert client.zcard("playbook:receipts") == OLD  # nothing rewritten


def test_a_call_without_input_keeps_none_through_the_rewrite(redis_url: str) -> None:
    """A receipt 0.x wrote for a call without input (its input ``""``) has none once rewritten."""
    _old_store(redis_url)
    _no_input(redis_url, 1)
    backend = RedisBackend(redis_url)
    found = backend.get(f"r{0:032x}")
    assert isinstance(found, Record) and found.input is None
    backend.close()


@pytest.mark.parametrize("command", [["stats"], ["list"], ["export"], ["spend"]])
def test_looking_at_an_older_store_from_the_command_line_rewrites_nothing(
    redis_url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``cache stats``, ``list``, ``export`` and ``spend`` open an older store read-only: an older
    playbook still using it finds it as it left it."""
    from playbook.frontends.cli import main

    _old_store(redis_url)
    assert main(["cache", *command, "--store", redis_url]) == 0
    with redis.Redis.from_url(redis_url) as client:
        assert client.zcard("playbook:receipts") == OLD
        assert len(client.keys("playbook:info:*")) == OLD + 1  # and the step record's
    if command == ["stats"]:
        assert f"receipts    {OLD} " in capsys.readouterr().out


def test_a_store_rewritten_says_older_releases_can_no_longer_read_it(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The process that rewrites an older store says, as it opens it, that the rewrite is one way:
    upgrade every process, never accept the loss an older release reports; a store already of
    this layout says nothing of it."""
    _old_store(redis_url)
    with caplog.at_level("WARNING", logger="playbook.store"):
        pb.ReceiptStore(redis_url).close()
    said = [r.getMessage() for r in caplog.records if "rewritten to playbook" in r.getMessage()]
    assert len(said) == 1 and f"playbook {pb.__version__}'s layout" in said[0]
    assert "upgrade every process that uses it" in said[0] and "do not accept the loss" in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="playbook.store"):
        pb.ReceiptStore(redis_url).close()
    assert not [r for r in caplog.records if "rewritten" in r.getMessage()]


def test_what_a_failover_loses_is_said_once_where_the_cluster_store_is_met(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A store on a cluster says what a failover loses in the first run of the process that uses
    it and in its stats (``cache stats`` too): not again in each later run, nor logged (on
    stderr) each time it is opened."""
    from playbook.frontends.cli import main

    words = "failover loses the receipts its replica had not received"

    @pb.tool(name="lookup", version="1")
    async def lookup(n: int) -> int:
        return n

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(lookup, n=row.n)}

    with RedisClusterServer() as cluster:  # its own: no earlier run in this process has said it
        with caplog.at_level("WARNING", logger="playbook.store"):
            store = pb.ReceiptStore(cluster.url)
        assert not [r for r in caplog.records if words in r.getMessage()]
        runs = [pd.DataFrame({"n": range(3)}).play.run(play, store=store, progress=False) for _ in range(2)]
        assert [sum(words in note for note in run.notices) for run in runs] == [1, 0]
        assert any(words in note for note in store.stats()["notes"])
        store.close()
        capsys.readouterr()
        assert main(["cache", "stats", "--store", cluster.url]) == 0
        out, err = capsys.readouterr()
        assert words in out and words not in err


def _move(cluster: RedisClusterServer, source: RedisServer, target: RedisServer, slots: list[int]) -> None:
    """Move ``slots`` and their keys from the master ``source`` to the master ``target``, as a
    resharding does (``SETSLOT`` importing and migrating, ``MIGRATE``, then every master told)."""
    into, out_of = (redis.Redis(port=node.port) for node in (target, source))
    into_id, out_of_id = (node.execute_command("CLUSTER", "MYID") for node in (into, out_of))
    for node, state, other in ((into, "IMPORTING", out_of_id), (out_of, "MIGRATING", into_id)):
        pipe = node.pipeline(transaction=False)
        for slot in slots:
            pipe.execute_command("CLUSTER", "SETSLOT", slot, state, other)
        pipe.execute()
    pipe = out_of.pipeline(transaction=False)
    for slot in slots:
        pipe.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    moving = out_of.pipeline(transaction=False)
    for keys in pipe.execute():
        if keys:
            moving.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    moving.execute()
    for master in cluster.masters():
        with redis.Redis(port=master.port) as node:
            pipe = node.pipeline(transaction=False)
            for slot in slots:
                pipe.execute_command("CLUSTER", "SETSLOT", slot, "NODE", into_id)
            pipe.execute()
    into.close()
    out_of.close()


def _owned(master: RedisServer) -> list[int]:
    """The slots ``master`` serves."""
    with redis.Redis(port=master.port) as node:
        return [
            slot
            for first, last, *_ in node.execute_command("CLUSTER", "SLOTS")
            if int(_[0][1]) == master.port
            for slot in range(int(first), int(last) + 1)
        ]


def test_slots_moved_mid_run_still_write_and_count_every_receipt_once() -> None:
    """Slots moved to another master mid-run (the store still sends them to the old one, which
    answers MOVED): every receipt is written once and counted once, and a rerun pays nothing."""
    paid: list[int] = []
    with RedisClusterServer() as cluster:
        source, target = cluster.masters()[:2]
        moved = _owned(source)[:2000]

        @pb.tool(name="lookup", version="1", cost=0.001)
        async def lookup(n: int) -> int:
            paid.append(n)
            if len(paid) == 200:
                _move(cluster, source, target, moved)
            return n

        async def play(row, ctx):  # type: ignore[no-untyped-def]
            return {"v": await ctx.tool(lookup, n=row.n)}

        frame = pd.DataFrame({"n": range(400)})
        store = pb.ReceiptStore(cluster.url)
        done = frame.play.run(pb.play(play, name="p"), store=store, progress=False, concurrency=8)
        assert done.stats.ok == 400 and done.stats.calls_executed == 400 and sorted(paid) == list(range(400))
        with redis.Redis(port=target.port) as node:
            landed = sum(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) for slot in moved)
        assert landed > 0  # receipts written to the moved slots, some of them after the move
        backend = RedisBackend(cluster.url)
        assert backend.receipt_count() == 400 and len(list(backend.records())) == 400
        again = frame.play.run(pb.play(play, name="p", version="2"), store=store, progress=False)
        assert again.stats.calls_executed == 0 and again.stats.calls_reused == 400
        assert store.lost is None
        for each in (backend, store):
            each.close()


def test_a_batch_across_a_moved_slot_counts_each_new_receipt_once() -> None:
    """A batch whose keys span a slot that moved since the store read the topology: the write
    answers how many receipts were new, exactly, and writing it again adds none."""
    with RedisClusterServer() as cluster:
        backend = RedisBackend(cluster.url)
        source, target = cluster.masters()[:2]
        records = _on(backend, source, 300)
        backend.write(records[:100])
        # the slots of the last records, after the others in the master's part of the batch
        _move(
            cluster,
            source,
            target,
            sorted({key_slot(f"playbook:{row.key}".encode()) for row in records[200:]}),
        )
        assert backend.write(records) == 200
        assert backend.write(records) == 0
        assert backend.receipt_count() == 300
        backend.close()


def test_each_slot_s_counter_keeps_the_name_stores_already_have() -> None:
    """The tag of each slot's counter is the first string of letters and digits, shortest first,
    that hashes to the slot: the name the counters of stores already written have."""
    alphabet = string.ascii_letters + string.digits
    first: dict[int, str] = {}
    for size in range(1, 4):
        for letters in itertools.product(alphabet, repeat=size):
            name = "".join(letters)
            first.setdefault(key_slot(name.encode()), name)
    assert len(first) == 16384
    assert [tag(slot) for slot in range(16384)] == [first[slot] for slot in range(16384)]


@pb.tool(name="doubled", version="1")
async def _doubled(n: int) -> int:
    import asyncio

    await asyncio.sleep(0.1)
    return n * 2


@pb.play(name="doubling")
async def _doubling(row, ctx):  # type: ignore[no-untyped-def]
    return {"v": await ctx.tool(_doubled, n=row["n"])}


@pytest.mark.slow
def test_a_cluster_that_stays_down_mid_run_ends_the_run_as_a_server_gone_does() -> None:
    """A master and its replica killed mid-run: after the cluster client's one wait for a failover,
    the store's calls fail at once while the cluster says it is down, so the run ends (rows that
    could not be recorded fail naming the cluster) instead of each call waiting out ~20 s."""
    import threading

    with RedisClusterServer() as cluster:
        store = pb.ReceiptStore(cluster.url)
        frame = pd.DataFrame({"n": range(300)})
        master = cluster.masters()[0]

        def kill() -> None:
            time.sleep(1.5)
            with redis.Redis(port=master.port) as client:
                replica_port = int(client.execute_command("ROLE")[2][0][1])
            cluster.kill(master)
            cluster.kill(next(node for node in cluster.nodes if node.port == replica_port))

        killer = threading.Thread(target=kill)
        ended: list[Any] = []
        runner = threading.Thread(
            target=lambda: ended.append(
                frame.play.run(_doubling, store=store, progress=False, concurrency=8)
            ),
            daemon=True,
        )
        began = time.monotonic()
        killer.start()
        runner.start()
        runner.join(120)
        killer.join()
        took = time.monotonic() - began
        assert ended, f"the run was still going after {took:.0f} s"
        run = ended[0]
        assert run.stats.ok + run.stats.failed == 300 and run.stats.failed > 0, run.stats
        assert took < 60, took
        assert "lost a master" in " ".join(run.notices), run.notices
