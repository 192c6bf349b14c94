"""Every store backend (SQLite, memory, Redis) keeps records, memos and leases the same way."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

import playbook as pb
from playbook._internal.redis_nodes import sync_client
from playbook._internal.urls import masked
from playbook.store.marks import Mark
from playbook.store.memory import MemoryBackend
from playbook.store.protocol import Backend, Counts, Damaged, Found, StoreFailure
from playbook.store.records import MemoRow, Record, memo_tools
from playbook.store.redis.backend import RedisBackend


def _key(kind: str, n: int) -> str:
    return f"{kind}{n:032x}"


def _record(
    key: str, *, tool: str = "lookup", at: float = 1_700_000_000.125, cost: float = 0.5, **fields: object
) -> Record:
    values: dict[str, object] = dict(
        version="1",
        account="default",
        miss=False,
        flags=0,
        input='{"q": "ä"}',
        output='{"a": [1, 2.5]}',
        error=None,
    )
    values.update(fields)
    return Record(key, tool, at=at, cost=cost, **values)  # type: ignore[arg-type]


def _memo(n: int, tools: dict[str, str] | None = None) -> MemoRow:
    used = memo_tools(tools if tools is not None else {"lookup": "f1"})
    return MemoRow(_key("m", n), "play-fp", used, calls=2, cost=0.75, flags=1, output=f'{{"row": {n}}}')


def _flush_scripts(url: str) -> None:
    """Forget every script the server (each node of a cluster) has seen: as a new or restarted one."""
    client = sync_client(url)
    if isinstance(client, redis.RedisCluster):
        for node in client.get_nodes():
            client.get_redis_connection(node).script_flush()
    else:
        client.script_flush()
    client.close()


@pytest.fixture(params=["sqlite", "memory", "redis", "redis cluster"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made: Backend
    if request.param == "sqlite":
        from playbook.store.sqlite import SqliteBackend

        made = SqliteBackend(tmp_path / "store")
    elif request.param == "memory":
        made = MemoryBackend()
    else:
        made = RedisBackend(
            request.getfixturevalue("redis_url" if request.param == "redis" else "cluster_url")
        )
    yield made
    made.close()


# -- receipts and step records -------------------------------------------------------------------


def test_written_record_reads_back(backend: Backend) -> None:
    """A written record comes back field for field from lookup, get and tool_of."""
    record = _record(_key("r", 1), miss=True, flags=3, error="no JSON form")
    backend.write([record])
    assert backend.lookup(record.key) == Found(record.output, True, 3, "no JSON form", record.at)
    assert backend.get(record.key) == record
    assert backend.tool_of(record.key) == "lookup"


def test_records_written_together_read_back_each_its_own(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """A batch of records with and without inputs, odd costs and names: each comes back as
    written (on Redis also when the server has not seen the script that writes the rest of a
    record: a new or restarted one)."""
    if isinstance(backend, RedisBackend):
        _flush_scripts(backend.location)
    records = [
        _record(_key("r", 1), input=None, cost=0.1 + 0.2),
        _record(
            _key("r", 2), tool="näme: with spaces", cost=1e-300, input='{"q": ""}', version="v 2", account="ä"
        ),
        _record(_key("r", 3), cost=0.0, input="[]"),
        _record(_key("s", 4), input=None),
    ]
    backend.write(records)
    assert [backend.get(record.key) for record in records] == records
    assert [backend.tool_of(record.key) for record in records] == [record.tool for record in records]


def test_a_write_says_how_many_receipts_it_added(backend: Backend) -> None:
    """What a store's count of receipts grew by (its mark expects it): receipts new to it, not
    those replaced nor step records, also in batches past a query's chunk of keys."""
    assert backend.write([_record(_key("r", n)) for n in range(3)] + [_record(_key("s", 1))]) == 3
    assert backend.write([_record(_key("r", n), at=2e9) for n in range(1, 5)] + [_record(_key("s", 2))]) == 2
    assert backend.get(_key("r", 1)) == _record(_key("r", 1), at=2e9)  # replaced, not kept
    # a key twice in one write: added once, the last one kept
    assert backend.write([_record(_key("r", 7), at=1.0), _record(_key("r", 7), at=2.0)]) == 1
    assert backend.get(_key("r", 7)) == _record(_key("r", 7), at=2.0)
    assert backend.write([_record(_key("r", n)) for n in range(1200)]) == 1194
    assert backend.write([_record(_key("s", 3))]) == 0 and backend.receipt_count() == 1200


def test_a_backend_keeps_its_marks_text(backend: Backend) -> None:
    """A mark is kept as the text it is given (marks.py reads it), the last one written; none before."""
    assert backend.read_mark() is None
    first = Mark(3, 1.0, backend.identity).text()
    backend.write_mark(first)
    assert backend.read_mark() == first
    later = Mark(5, 2.0, backend.identity, accepted=True).text()
    backend.write_mark(later)
    assert backend.read_mark() == later and Mark.parse(backend.read_mark()) == Mark(
        5, 2.0, backend.identity, True
    )


def test_absent_key_is_none(backend: Backend) -> None:
    """A key never written is None for lookup, get and tool_of."""
    assert backend.lookup(_key("r", 9)) is None
    assert backend.get(_key("r", 9)) is None
    assert backend.tool_of(_key("r", 9)) is None


def test_lookup_many_matches_lookup(backend: Backend) -> None:
    """lookup_many answers each key as lookup does, in order, present or not."""
    backend.write([_record(_key("r", n), at=float(n)) for n in range(0, 10, 2)] + [_record(_key("s", 1))])
    keys = [_key("r", n) for n in range(10)] + [_key("s", 1)]
    assert backend.lookup_many(keys) == [backend.lookup(key) for key in keys]
    assert [found is not None for found in backend.lookup_many(keys)] == [n % 2 == 0 for n in range(10)] + [
        True
    ]
    assert backend.lookup_many([]) == []


def test_rewritten_record_keeps_nothing_of_the_old(backend: Backend) -> None:
    """Writing a key again replaces the whole record, fields it no longer has included."""
    backend.write([_record(_key("r", 1), error="was an error")])
    again = _record(_key("r", 1), input=None, error=None, output="2", at=5.0)
    backend.write([again])
    assert backend.get(again.key) == again


def test_records_lists_receipts_oldest_first(backend: Backend) -> None:
    """records() lists receipts only (no step records), oldest first, all or one tool's."""
    backend.write(
        [
            _record(_key("r", 1), at=30.0),
            _record(_key("r", 2), at=10.0, tool="other"),
            _record(_key("r", 3), at=20.0),
        ]
    )
    backend.write([_record(_key("s", 1), at=5.0)])
    assert [key for key, _ in backend.records()] == [_key("r", 2), _key("r", 3), _key("r", 1)]
    assert [key for key, _ in backend.records("lookup")] == [_key("r", 3), _key("r", 1)]
    assert dict(backend.records())[_key("r", 2)] == _record(_key("r", 2), at=10.0, tool="other")
    assert list(backend.records("nobody")) == []


# -- row memos -----------------------------------------------------------------------------------


def test_memos_read_back_in_bulk(backend: Backend) -> None:
    """3000 written memos all come back from one memos() call; absent keys are left out."""
    rows = [_memo(n) for n in range(3000)]
    backend.write_memos(rows)
    backend.fold_memos()
    found, bad = backend.memos([row.key for row in rows] + [_key("m", 99_999)])
    assert sorted(found) == sorted(rows)
    assert bad == []


def test_memos_written_are_found_once_folded_the_last_of_a_key_winning(backend: Backend) -> None:
    """Memos written in several writes (one key twice) are all found after one fold, each key with
    the memo written last; a fold with nothing to fold changes nothing."""
    backend.write_memos([_memo(n) for n in range(0, 2000, 2)])
    backend.write_memos([_memo(n) for n in range(1, 2000, 2)] + [_memo(4, {"other": "f2"})])
    backend.fold_memos()
    backend.fold_memos()
    found, bad = backend.memos([_key("m", n) for n in range(2000)])
    assert (
        sorted(found) == sorted([_memo(n) for n in range(2000) if n != 4] + [_memo(4, {"other": "f2"})])
        and bad == []
    )
    assert backend.counts().memos == 2000


def test_sqlite_memos_another_process_appended_are_found_once_a_run_folds_them(tmp_path: Path) -> None:
    """Memos one process appended (its run still going, or killed) are found by a run that starts
    in another process: it folds them in first. Read-only, the store leaves them where they are."""
    from playbook.store.sqlite import SqliteBackend

    writer, reader = SqliteBackend(tmp_path / "store"), SqliteBackend(tmp_path / "store")
    writer.write_memos([_memo(n) for n in range(100)])
    looking = SqliteBackend(tmp_path / "store", readonly=True)
    looking.fold_memos()
    assert looking.memos([_key("m", 1)])[0] == [] and looking.counts().memos == 100  # counted, not yet found
    reader.fold_memos()
    found, _ = reader.memos([_key("m", n) for n in range(100)])
    assert sorted(found) == [_memo(n) for n in range(100)]
    writer.write_memos([_memo(100)])  # the first process goes on
    reader.fold_memos()
    assert reader.memos([_key("m", 100)])[0] == [_memo(100)] and looking.counts().memos == 101
    for backend in (writer, reader, looking):
        backend.close()


def test_sqlite_lookups_on_the_loop_find_another_process_s_receipt_from_the_next_turn(tmp_path: Path) -> None:
    """Lookups of one turn of the event loop share a snapshot: a receipt another process writes
    meanwhile is found from the next turn on (and within the turn, after a window of lookups)."""
    from playbook.store.sqlite import SqliteBackend

    mine, other = SqliteBackend(tmp_path / "store"), SqliteBackend(tmp_path / "store")
    first, second = _record(_key("r", 1)), _record(_key("r", 2))

    async def run() -> tuple[list[object], list[object]]:
        assert mine.lookup(first.key) is None
        other.write([first])
        await asyncio.sleep(0)
        next_turn = [mine.lookup(first.key)]
        other.write([second])
        same_turn = [mine.lookup(second.key) for _ in range(300)]
        return next_turn, same_turn

    next_turn, same_turn = asyncio.run(run())
    assert next_turn == [mine.lookup(first.key)] and next_turn[0] is not None
    # A snapshot serves a window of lookups at most: the receipt is found well within the turn.
    assert same_turn[-1] is not None and same_turn.index(same_turn[-1]) <= 256
    mine.close()
    other.close()


def test_sqlite_a_lookup_after_a_run_on_a_kept_loop_sees_what_was_written_since(tmp_path: Path) -> None:
    """A loop kept between runs stops with its last turn's end still to come: a lookup made
    after the run, off the loop, still reads the store as it is now, and so does the next run."""
    from playbook.store.sqlite import SqliteBackend

    mine, other = SqliteBackend(tmp_path / "store"), SqliteBackend(tmp_path / "store")
    first, second = _record(_key("r", 1)), _record(_key("r", 2))

    found: list[object] = []

    async def look(key: str) -> None:
        found.append(mine.lookup(key))

    async def run(key: str) -> asyncio.Task[None]:
        # its lookup comes in the run's last turn, after the run's end has stopped the loop
        return asyncio.get_running_loop().create_task(look(key))

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run(first.key))
        other.write([first])
        found.append(mine.lookup(first.key))
        loop.run_until_complete(run(second.key))
        other.write([second])
        loop.run_until_complete(look(second.key))
    finally:
        loop.close()
    assert found[0] is None and found[1] is not None and found[2] is None and found[3] is not None
    mine.close()
    other.close()


def test_sqlite_a_write_after_lookups_in_the_same_turn_is_committed_and_seen(tmp_path: Path) -> None:
    """A write in the turn of lookups (a receipt, memos, a lease) is committed as usual, and the
    lookups after it see it; other processes see it at once."""
    from playbook.store.sqlite import SqliteBackend

    mine, other = SqliteBackend(tmp_path / "store"), SqliteBackend(tmp_path / "store")
    record = _record(_key("r", 1))

    async def run() -> tuple[object, object, list[bool]]:
        missing = mine.lookup(record.key)
        mine.write([record])
        taken = mine.take([_key("r", 2)], "me", 30.0)
        return missing, mine.lookup(record.key), taken

    missing, found, taken = asyncio.run(run())
    assert missing is None and found is not None and taken == [True]
    assert other.lookup(record.key) == found and other.holder(_key("r", 2)) is not None
    mine.close()
    other.close()


def test_sqlite_lookups_hold_back_no_checkpoint_once_their_turn_ends(tmp_path: Path) -> None:
    """The read transaction lookups share ends with their turn of the loop: another process can
    then copy the whole log into the file and truncate it (a reader would hold it back)."""
    from playbook.store.sqlite import SqliteBackend

    mine, other = SqliteBackend(tmp_path / "store"), SqliteBackend(tmp_path / "store")
    other.write([_record(_key("r", 1))])

    async def run() -> None:
        assert mine.lookup(_key("r", 1)) is not None
        other.write([_record(_key("r", 2))])
        await asyncio.sleep(0)

    asyncio.run(run())
    con = sqlite3.connect(tmp_path / "store" / "receipts.db", timeout=0.2)
    busy, _, _ = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    con.close()
    assert busy == 0
    mine.close()
    other.close()


def test_a_store_without_a_memo_log_opened_read_only_counts_its_memos(tmp_path: Path) -> None:
    """A store an earlier playbook made has no memo log; opened read-only (nothing is added), its
    memos are still counted and read."""
    from playbook.store.sqlite import SqliteBackend

    made = SqliteBackend(tmp_path / "store")
    made.write_memos([_memo(1), _memo(2, {"other": "f2"})])
    made.fold_memos()
    made.close()
    con = sqlite3.connect(tmp_path / "store" / "receipts.db")
    con.execute("DROP TABLE memo_log")
    con.commit()
    con.close()
    old = SqliteBackend(tmp_path / "store", readonly=True)
    assert old.counts().memos == 2 and old.memo_count("other") == 1 and old.memo_count("lookup") == 1
    old.fold_memos()
    assert len(old.memos([_key("m", 1), _key("m", 2)])[0]) == 2
    old.close()


# -- upkeep --------------------------------------------------------------------------------------


def _fill(backend: Backend) -> None:
    backend.write(
        [
            _record(_key("r", 1), cost=1.0),
            _record(_key("r", 2), cost=0.5),
            _record(_key("r", 3), tool="other", cost=0.25),
        ]
    )
    backend.write([_record(_key("s", 1), tool="lookup")])
    backend.write_memos([_memo(1), _memo(2, {"other": "f2"})])
    backend.fold_memos()
    backend.write_memos(
        [_memo(3, {"lookup": "f1", "other": "f2"})]
    )  # not folded yet: counted and cleared all the same


def test_counts(backend: Backend) -> None:
    """counts() gives receipts per tool with their cost (no step records), and the memos."""
    _fill(backend)
    counts = backend.counts()
    assert isinstance(counts, Counts)
    assert counts.by_tool == {"lookup": (2, 1.5), "other": (1, 0.25)}
    assert counts.memos == 3
    assert counts.bytes > 0


def test_clear_tool_drops_its_receipts_and_memos(backend: Backend) -> None:
    """clear(tool) drops that tool's receipts and the memos that used it, nothing else."""
    _fill(backend)
    assert backend.memo_count("lookup") == 2
    assert backend.clear("lookup") == 2
    assert [key for key, _ in backend.records()] == [_key("r", 3)]
    assert backend.lookup(_key("s", 1)) is not None  # a step record belongs to its row
    backend.fold_memos()
    found, _ = backend.memos([_key("m", n) for n in (1, 2, 3)])
    assert [fields[0] for fields in found] == [
        _key("m", 2)
    ]  # a memo as its fields (MemoFields): its key first
    assert backend.memo_count("lookup") == 0
    assert backend.memo_count("other") == 1
    assert backend.counts().by_tool == {"other": (1, 0.25)}


def test_clear_everything(backend: Backend) -> None:
    """clear() empties records and memos (and counts them) but keeps live leases."""
    _fill(backend)
    backend.take([_key("r", 7)], "owner", 30)
    assert backend.clear() == 7
    assert list(backend.records()) == []
    assert backend.lookup(_key("s", 1)) is None
    backend.fold_memos()
    assert backend.memos([_key("m", n) for n in (1, 2, 3)]) == ([], [])
    assert backend.counts()[:2] == ({}, 0)
    assert backend.holder(_key("r", 7)) is not None


# -- what runs spent -----------------------------------------------------------------------------


def test_spend_lines_add_up_per_day_provider_and_tool_and_outlive_clear(backend: Backend) -> None:
    """Lines of one day, provider and tool add up (runs of several processes add theirs), their
    unpriced calls too; names with odd characters come back as written; clearing receipts keeps
    what was spent."""
    backend.write_spend(
        [
            ("2026-12-04", "acme", "lookup", 3, 1.5, 2, 1.0, 0, 0),
            ("2026-12-04", "", "play p", 0, 0.0, 5, 2.5, 0, 1),
            ("2026-12-04", "local", "llm", 2, 0.0, 1, 0.0, 2, 1),
        ]
    )
    backend.write_spend(
        [
            ("2026-12-04", "acme", "lookup", 1, 0.25, 0, 0.0, 0, 0),
            ("2026-12-04", "local", "llm", 3, 0.0, 0, 0.0, 3, 0),
            ("2026-12-05", "ä:b\x1f", 't "q"', 1, 0.1, 0, 0.0, 0, 0),
        ]
    )
    assert sorted(backend.spend_rows()) == [
        ("2026-12-04", "", "play p", 0, 0.0, 5, 2.5, 0, 1),
        ("2026-12-04", "acme", "lookup", 4, 1.75, 2, 1.0, 0, 0),
        ("2026-12-04", "local", "llm", 5, 0.0, 1, 0.0, 5, 1),
        ("2026-12-05", "ä:b\x1f", 't "q"', 1, 0.1, 0, 0.0, 0, 0),
    ]
    _fill(backend)
    backend.clear()
    assert len(backend.spend_rows()) == 4


def test_spend_by_something_else_is_refused_naming_what_it_can_be(tmp_path: Path) -> None:
    with pb.ReceiptStore(tmp_path / "store") as store:
        assert store.spend().empty and list(store.spend()) == [
            "provider",
            "tool",
            "day",
            "calls_paid",
            "cost_paid",
            "calls_reused",
            "cost_saved",
            "calls_unpriced",
            "reused_unpriced",
        ]
        for bad in ("dya", ("tool", "tool"), ["provider", 3], 5, None):
            with pytest.raises(ValueError, match="'day', 'provider', 'tool'"):
                store.spend(by=bad)  # type: ignore[arg-type]
        from playbook.store import engine
        from playbook.store.spending import SpendLines

        for price in (0.1, 0.2):  # two runs: 0.1 + 0.2 is 0.30000000000000004 in floats
            engine(store).add_spend(
                SpendLines({("acme", "lookup"): [1, price, 0, 0.0, 0, 0]}), 1_764_806_400.0
            )
        assert store.spend(by="provider").to_dict("records") == [
            {
                "provider": "acme",
                "calls_paid": 2,
                "cost_paid": 0.3,
                "calls_reused": 0,
                "cost_saved": 0.0,
                "calls_unpriced": 0,
                "reused_unpriced": 0,
            }
        ]  # money to 9 decimals, as run.stats says it


def test_a_spend_table_of_an_older_playbook_gains_the_unpriced_columns(tmp_path: Path) -> None:
    """A store whose spend table has no unpriced columns: read-only, its lines read with none;
    opened to write, it gains them, keeps its lines and adds unpriced calls to them."""
    from playbook.store.sqlite import SqliteBackend

    SqliteBackend(tmp_path / "store").close()
    con = sqlite3.connect(tmp_path / "store" / "receipts.db")
    con.execute("DROP TABLE spend")
    con.execute(
        "CREATE TABLE spend (day TEXT NOT NULL, provider TEXT NOT NULL, tool TEXT NOT NULL, calls_paid INTEGER NOT NULL, "
        "cost_paid REAL NOT NULL, calls_reused INTEGER NOT NULL, cost_saved REAL NOT NULL, PRIMARY KEY (day, provider, tool)) WITHOUT ROWID"
    )
    con.execute("INSERT INTO spend VALUES ('2026-12-04', '', 'llm', 3, 0.5, 1, 0.25)")
    con.commit()
    con.close()
    with pb.ReceiptStore(tmp_path / "store", readonly=True) as old:
        assert old.spend(by="tool").to_dict("records") == [
            {
                "tool": "llm",
                "calls_paid": 3,
                "cost_paid": 0.5,
                "calls_reused": 1,
                "cost_saved": 0.25,
                "calls_unpriced": 0,
                "reused_unpriced": 0,
            }
        ]
    backend = SqliteBackend(tmp_path / "store")
    backend.write_spend([("2026-12-04", "", "llm", 2, 0.0, 0, 0.0, 2, 0)])
    assert backend.spend_rows() == [("2026-12-04", "", "llm", 5, 0.5, 1, 0.25, 2, 0)]
    backend.close()


def test_a_store_without_a_spend_table_opened_read_only_has_spent_nothing(tmp_path: Path) -> None:
    """A store an earlier playbook made has no spend table; opened read-only, it has no lines."""
    from playbook.store.sqlite import SqliteBackend

    SqliteBackend(tmp_path / "store").close()
    con = sqlite3.connect(tmp_path / "store" / "receipts.db")
    con.execute("DROP TABLE spend")
    con.commit()
    con.close()
    old = SqliteBackend(tmp_path / "store", readonly=True)
    assert old.spend_rows() == []
    old.close()


# -- leases --------------------------------------------------------------------------------------


def test_lease_goes_to_the_first_owner(backend: Backend) -> None:
    """Of two owners taking the same keys, only the first gets them."""
    assert backend.take([_key("r", 1), _key("r", 2)], "a", 30) == [True, True]
    assert backend.take([_key("r", 2), _key("r", 3)], "b", 30) == [False, True]


def test_owner_takes_its_lease_again(backend: Backend) -> None:
    """The owner of a live lease can take it again."""
    assert backend.take([_key("r", 1)], "a", 30) == [True]
    assert backend.take([_key("r", 1)], "a", 30) == [True]


def test_only_the_owner_releases(backend: Backend) -> None:
    """A release by another owner does nothing; the owner's frees the key."""
    backend.take([_key("r", 1)], "a", 30)
    backend.release([_key("r", 1)], "b")
    assert backend.take([_key("r", 1)], "b", 30) == [False]
    backend.release([_key("r", 1)], "a")
    assert backend.holder(_key("r", 1)) is None
    assert backend.take([_key("r", 1)], "b", 30) == [True]


def test_a_write_gives_back_the_owners_leases_of_its_receipts(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """Leases named with a write are freed by it, the owner's only; on Redis also when the server has
    not seen the script that frees them (a new or restarted server): the write still goes in."""
    backend.take([_key("r", 1), _key("r", 2)], "a", 30)
    backend.take([_key("r", 3)], "b", 30)
    if isinstance(backend, RedisBackend):
        _flush_scripts(backend.location)
    backend.write(
        [_record(_key("r", 1)), _record(_key("r", 2))], [_key("r", 1), _key("r", 2), _key("r", 3)], "a"
    )
    assert backend.lookup(_key("r", 1)) is not None and backend.lookup(_key("r", 2)) is not None
    assert backend.holder(_key("r", 1)) is None and backend.holder(_key("r", 2)) is None
    assert backend.take([_key("r", 3)], "a", 30) == [False]  # b's lease is b's
    backend.take([_key("r", 4)], "a", 30)
    backend.write([_record(_key("r", 4))], [_key("r", 4)], "a")
    assert backend.holder(_key("r", 4)) is None and backend.lookup(_key("r", 4)) is not None


def test_taking_leases_reads_their_receipts_as_they_are_once_taken(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """take_and_look() answers as take() then lookup_many() would, on Redis also when the server has
    not seen the lease script yet."""
    backend.write([_record(_key("r", 1))])
    backend.take([_key("r", 2)], "b", 30)
    if isinstance(backend, RedisBackend):
        _flush_scripts(backend.location)
    keys = [_key("r", 1), _key("r", 2), _key("r", 3)]
    got, found = backend.take_and_look(keys, "a", 30)
    assert got == [True, False, True] and found == backend.lookup_many(keys)
    assert found[0] is not None and found[1:] == [None, None]
    assert backend.take_and_look([_key("r", 3)], "a", 30) == (
        [True],
        [None],
    )  # the script loaded now; a's own lease
    assert backend.take_and_look([], "a", 30) == ([], [])


def test_leases_past_a_querys_chunk_are_taken_looked_at_and_given_back(backend: Backend) -> None:
    """A thousand and more leases at once: each read with its receipt where one is, each given
    back by the write of its receipt or by a release."""
    keys = [_key("r", n) for n in range(1300)]
    backend.write([_record(key) for key in keys[::100]])
    got, found = backend.take_and_look(keys, "a", 30)
    assert got == [True] * 1300
    assert [n for n, one in enumerate(found) if one is not None] == list(range(0, 1300, 100))
    assert found == backend.lookup_many(keys)
    backend.write([_record(key) for key in keys[:1200]], keys[:1200], "a")
    backend.release(keys[1200:], "a")
    assert backend.take(keys, "b", 30) == [True] * 1300


def test_lease_lapses_after_its_time(backend: Backend) -> None:
    """Once a lease's time is up, another owner takes it."""
    backend.take([_key("r", 1)], "a", 0.2)
    time.sleep(0.3)
    assert backend.holder(_key("r", 1)) is None
    assert backend.take([_key("r", 1)], "b", 30) == [True]


def test_renew_keeps_the_lease(backend: Backend) -> None:
    """A renewed lease outlives its first time; another owner's renewal changes nothing."""
    backend.take([_key("r", 1), _key("r", 2)], "a", 0.2)
    backend.renew([_key("r", 1)], "a", 5)
    backend.renew([_key("r", 2)], "b", 5)
    time.sleep(0.3)
    assert backend.take([_key("r", 1), _key("r", 2)], "b", 30) == [False, True]


def test_holder_names_owner_and_time_left(backend: Backend) -> None:
    """holder() says who holds a key and for how many more seconds."""
    assert backend.holder(_key("r", 1)) is None
    backend.take([_key("r", 1)], "host:123:abc", 10)
    held = backend.holder(_key("r", 1))
    assert held is not None
    assert held[0] == "host:123:abc"
    assert 9 < held[1] <= 10


def test_threads_share_one_backend(backend: Backend) -> None:
    """Eight threads write and read at once, and exactly one of them wins a contested lease."""

    def work(n: int) -> tuple[bool, list[Found | Damaged | None]]:
        keys = [_key("r", n * 100 + i) for i in range(50)]
        backend.write([_record(key) for key in keys])
        return backend.take([_key("r", 99_999)], f"owner{n}", 30)[0], backend.lookup_many(keys)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(8)))
    assert sum(won for won, _ in results) == 1
    assert all(isinstance(found, Found) for _, founds in results for found in founds)


# -- damage (memory cannot be damaged: it keeps the tuples it is given) --------------------------


def _damage(backend: Backend, tmp_path: Path, key: str, table: str) -> None:
    """Put bytes that are not UTF-8 in the output of ``key``, behind the backend's back."""
    if isinstance(backend, RedisBackend):
        client = redis.Redis.from_url(backend.location)
        header = client.get(f"playbook:{key}").partition(b"\n")[0]
        client.set(f"playbook:{key}", header + b"\n\xff")  # a header intact, an output not UTF-8
        client.close()
        return
    con = sqlite3.connect(tmp_path / "store" / "receipts.db")
    con.execute(f"UPDATE {table} SET output = CAST(x'ff' AS TEXT) WHERE key = ?", (key,))
    con.commit()
    con.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)
def test_text_that_is_not_utf8_is_damaged(backend: Backend, tmp_path: Path) -> None:
    """A record or memo whose text is not UTF-8 reads as Damaged (or a bad memo), never a crash."""
    backend.write([_record(_key("r", 1)), _record(_key("r", 2), at=2e9)])
    backend.write_memos([_memo(1), _memo(2)])
    backend.fold_memos()
    _damage(backend, tmp_path, _key("r", 1), "receipt")
    _damage(backend, tmp_path, _key("m", 1), "memo")
    damaged = Damaged("its value is not UTF-8 text (damaged)")
    assert backend.lookup(_key("r", 1)) == damaged
    assert backend.lookup_many([_key("r", 1), _key("r", 2)]) == [damaged, backend.lookup(_key("r", 2))]
    assert backend.get(_key("r", 1)) == damaged
    assert backend.tool_of(_key("r", 1)) == "lookup"
    assert [(key, isinstance(record, Damaged)) for key, record in backend.records()] == [
        (_key("r", 1), True),
        (_key("r", 2), False),
    ]
    assert backend.memos([_key("m", 1), _key("m", 2)]) == ([_memo(2)], [_key("m", 1)])


# -- Redis only ----------------------------------------------------------------------------------


def test_redis_unreachable_names_the_url() -> None:
    """A Redis URL that nothing answers at fails within seconds, naming the URL and why.  In real
    time: a refused connection, not a timeout waited out (5 s is ten times what it takes here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # bound, not listening: refused
        started = time.monotonic()
        with pytest.raises(StoreFailure) as failed:
            RedisBackend(url).lookup(_key("r", 1))
    assert time.monotonic() - started < 5
    assert failed.value.reason == f"cannot reach Redis at {url} (Connection refused)"
    assert failed.value.code == "ECONNREFUSED"


def test_redis_password_is_never_shown(redis_url: str) -> None:
    """The password in a Redis URL is masked in the location and in failures."""
    assert masked("redis://:s3cret@db.example:6379/0") == "redis://:***@db.example:6379/0"
    assert masked("rediss://me:s3cret@db.example/1?password=s3cret&ssl_cert_reqs=none") == (
        "rediss://me:***@db.example/1?password=***&ssl_cert_reqs=none"
    )
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("requirepass", "s3cret")  # the connection that set it stays signed in
    try:
        backend = RedisBackend(redis_url.replace("redis://", "redis://:s3cret@"))
        assert backend.location == redis_url.replace("redis://", "redis://:***@")
        backend.close()
        with pytest.raises(StoreFailure) as failed:
            RedisBackend(redis_url.replace("redis://", "redis://:wrong@"))
    finally:
        admin.config_set("requirepass", "")
        admin.close()
    assert "s3cret" not in failed.value.reason and "wrong" not in failed.value.reason
    assert redis_url.replace("redis://", "redis://:***@") in failed.value.reason
    assert failed.value.code == "WRONGPASS"


def test_redis_lookup_many_is_one_round_trip(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """lookup_many of 500 keys sends one request to Redis, not 500."""
    from redis.connection import AbstractConnection

    backend = RedisBackend(redis_url)
    keys = [_key("r", n) for n in range(500)]
    backend.write([_record(key) for key in keys[::2]])
    sent: list[object] = []
    send = AbstractConnection.send_packed_command

    def counted(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        sent.append(command)
        send(self, command, check_health)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    found = backend.lookup_many(keys)
    assert len(sent) == 1
    assert [f is not None for f in found] == [n % 2 == 0 for n in range(500)]
    backend.close()


def test_redis_out_of_memory_is_said_and_writes_nothing(redis_url: str) -> None:
    """A Redis at its memory limit refuses a batch of records whole, and says so in words."""
    backend = RedisBackend(redis_url)
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("maxmemory", 1)
    try:
        with pytest.raises(StoreFailure) as failed:
            backend.write([_record(_key("r", 1)), _record(_key("r", 2))])
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    assert failed.value.code == "OOM"
    assert "out of memory" in failed.value.reason and redis_url in failed.value.reason
    assert backend.lookup_many([_key("r", 1), _key("r", 2)]) == [None, None]
    assert list(backend.records()) == []
    backend.close()


def test_redis_readonly_refuses_writes(redis_url: str) -> None:
    """A Redis store opened read-only reads but refuses every write."""
    RedisBackend(redis_url).write([_record(_key("r", 1))])
    backend = RedisBackend(redis_url, readonly=True)
    assert backend.lookup(_key("r", 1)) is not None
    for write in (
        lambda: backend.write([_record(_key("r", 2))]),
        lambda: backend.clear(),
        lambda: backend.take([_key("r", 1)], "a", 1),
    ):
        with pytest.raises(StoreFailure):
            write()
    assert backend.lookup(_key("r", 2)) is None


def test_redis_backend_survives_fork(redis_url: str) -> None:
    """A forked child uses the parent's backend on connections of its own, and the parent's still work."""
    backend = RedisBackend(redis_url)
    backend.write([_record(_key("r", 1))])
    assert backend.lookup(_key("r", 1)) is not None  # the parent now holds a pooled connection
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # fork() with threads about (other tests' servers)
        pid = os.fork()
    if pid == 0:
        try:
            ok = backend.lookup(_key("r", 1)) is not None and backend.take([_key("r", 2)], "child", 30) == [
                True
            ]
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    assert backend.lookup(_key("r", 1)) is not None
    assert backend.holder(_key("r", 2)) == ("child", pytest.approx(30, abs=1))
    backend.close()


def test_redis_keys_stay_under_the_prefix(redis_url: str) -> None:
    """Two prefixes on one server are two stores: clearing one leaves the other."""
    first, second = RedisBackend(redis_url, prefix="one"), RedisBackend(redis_url, prefix="two")
    for backend in (first, second):
        _fill(backend)
    first.clear()
    assert list(first.records()) == []
    assert len(list(second.records())) == 3
    admin = redis.Redis.from_url(redis_url)
    assert all(key.startswith((b"one:", b"two:")) for key in admin.scan_iter())
    admin.close()
